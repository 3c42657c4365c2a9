"""bcd's status socket works however deep its root lies (sockaddr_un holds 107 bytes)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import anyio
import pytest

from better_compute.agent.node.unix_path import SUN_PATH_MAX, reachable


def _deep(tmp_path: Path) -> Path:
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    path = folder / "status.sock"
    assert len(str(path).encode()) > SUN_PATH_MAX
    return path


def test_a_plain_bind_of_a_long_path_fails_so_the_detour_is_needed(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s, pytest.raises(OSError, match="too long"):
        s.bind(str(_deep(tmp_path)))


def test_a_listener_on_a_long_path_is_reached_at_its_real_path(tmp_path: Path) -> None:
    path = _deep(tmp_path)

    async def main() -> bytes:
        with reachable(path) as address:
            listener = await anyio.create_unix_listener(address, mode=0o600)
        async with listener:
            assert path.is_socket() and stat.S_IMODE(path.stat().st_mode) == 0o600

            def client() -> bytes:
                with socket.socket(socket.AF_UNIX) as s:
                    with reachable(path) as target:
                        s.connect(target)
                    return s.recv(5)

            async with anyio.create_task_group() as group:
                async def serve() -> None:
                    conn = await listener.accept()
                    await conn.send(b"hello")
                    await conn.aclose()

                group.start_soon(serve)
                received = await anyio.to_thread.run_sync(client)
        return received

    assert anyio.run(main) == b"hello"


def test_a_short_path_is_used_as_it_is(tmp_path: Path) -> None:
    with reachable(tmp_path / "s.sock") as address:
        assert address == str(tmp_path / "s.sock")
