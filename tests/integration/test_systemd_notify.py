"""Type=notify readiness: `serve` and `bcd node` send READY=1 and STOPPING=1 on $NOTIFY_SOCKET.

A real unix datagram socket stands in for systemd's; the processes are real. Without
NOTIFY_SOCKET nothing is sent (api/wire/daemon.py's notify is a no-op).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from better_compute.api import pki
from better_compute.api.wire.daemon import notify
from tests.bcd_fake_gateway import FakeGateway, make_node_root
from tests.support import BCD, initialize, serve, store_env


@contextlib.contextmanager
def systemd_socket() -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket where systemd's would be (short path: sun_path is 108 bytes)."""
    folder = tempfile.mkdtemp(prefix="bc-notify.", dir="/tmp")
    path = os.path.join(folder, "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    try:
        yield path, sock
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(folder)


def test_notify_is_a_no_op_outside_systemd() -> None:
    assert notify("READY=1", {}) is False


def test_notify_reaches_an_abstract_socket() -> None:
    name = f"bc-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        assert notify("READY=1", {"NOTIFY_SOCKET": f"@{name}"}) is True
        assert sock.recv(64) == b"READY=1"


def test_serve_tells_systemd_when_it_is_ready_and_when_it_stops(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    with systemd_socket() as (path, sock):
        with serve({**env, "NOTIFY_SOCKET": path}):
            # serve() returned after the ready line: READY=1 was sent right after it.
            assert sock.recv(64) == b"READY=1"
        assert sock.recv(64) == b"STOPPING=1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_bcd_node_tells_systemd_when_it_is_ready_and_when_it_stops(tmp_path: Path) -> None:
    bundle = pki.generate_bundle()
    (tmp_path / "gw").mkdir()
    with systemd_socket() as (path, sock):
        async with anyio.create_task_group() as group:
            gateway = FakeGateway(bundle, None, tmp_path / "gw")  # type: ignore[arg-type]
            port = await group.start(gateway.serve)
            root = make_node_root(tmp_path / "n", bundle, f"https://127.0.0.1:{port}")
            gateway.node_key = root.key.public_key()
            env = {"PATH": os.environ.get("PATH", ""), "BCD_ROOT": str(root.paths.root),
                   "BCD_GPU_SOURCE": f"fake:{root.gpu_file}", "NOTIFY_SOCKET": path}
            process = await anyio.open_process([BCD, "node"], env=env)
            try:
                ready = await anyio.to_thread.run_sync(sock.recv, 64)
                assert ready == b"READY=1"
                assert root.paths.socket.exists()  # ready means `bcd status` answers
                process.send_signal(signal.SIGTERM)
                assert await anyio.to_thread.run_sync(sock.recv, 64) == b"STOPPING=1"
                with anyio.fail_after(20):
                    assert await process.wait() == 0
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                await process.aclose()
            gateway.stop()
