"""The real `bcd node` and `bcd status` processes against the in-test gateway.

As an operator runs them: `bcd node --config /etc/bcd/config.toml` (re-rooted under
BCD_ROOT), its ready line, `bcd status` and `bcd status --json` over the unix socket,
and a clean exit on SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from better_compute.api import pki
from tests.bcd_fake_gateway import NODE_ID, FakeGateway, make_node_root
from tests.support import BCD

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _line_with(reader: BufferedByteReceiveStream, text: str, seen: list[str],
                     timeout: float = 20.0) -> str:
    with anyio.fail_after(timeout):
        while True:
            line = (await reader.receive_until(b"\n", 1 << 16)).decode()
            seen.append(line)
            if text in line:
                return line


def _env(root: Path, gpu_file: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "BCD_ROOT": str(root),
            "BCD_GPU_SOURCE": f"fake:{gpu_file}"}


async def test_bcd_node_runs_serves_status_and_stops_on_sigterm(tmp_path: Path) -> None:
    bundle = pki.generate_bundle()
    (tmp_path / "gw").mkdir()
    async with anyio.create_task_group() as group:
        gateway = FakeGateway(bundle, None, tmp_path / "gw")  # type: ignore[arg-type]
        port = await group.start(gateway.serve)
        root = make_node_root(tmp_path / "n", bundle, f"https://127.0.0.1:{port}")
        gateway.node_key = root.key.public_key()
        env = _env(root.paths.root, root.gpu_file)
        process: Process = await anyio.open_process(
            [BCD, "node", "--config", "/etc/bcd/config.toml"], env=env)
        seen: list[str] = []
        try:
            assert process.stdout is not None
            reader = BufferedByteReceiveStream(process.stdout)
            await _line_with(reader, "bcd node: session connected (epoch 1)", seen)
            await gateway.wait_for(lambda: 1 in gateway.accepted and gateway.last_report
                                   is not None and gateway.last_report.applied_generation == 1)

            text = await anyio.run_process([BCD, "status"], env=env)
            lines = text.stdout.decode().splitlines()
            assert lines[0].startswith(f"node     {NODE_ID}")
            assert lines[1].startswith("session  connected (epoch 1)")
            assert "applied generation 1, observed generation 1" in lines[2]
            assert any(line.startswith("section  acceptance: passed") for line in lines)
            assert sum(line.startswith("gpu ") for line in lines) == 8

            as_json = await anyio.run_process([BCD, "status", "--json"], env=env)
            status = json.loads(as_json.stdout)
            assert status["schemaVersion"] == 1 and status["node"]["id"] == NODE_ID
            assert status["session"]["epoch"] == 1 and len(status["gpus"]) == 8
            assert {gpu["family"] for gpu in status["gpus"]} == {"H100"}

            second = await anyio.run_process([BCD, "node"], env=env, check=False)
            assert second.returncode == 6  # conflict, graded as the CLI's (docs/bcd.md)
            assert b"already running" in second.stderr

            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                assert await process.wait() == 0
            rest = b""
            with contextlib.suppress(anyio.EndOfStream):
                while True:
                    rest += await reader.receive()
            assert "bcd node: stopping (SIGTERM)" in rest.decode()
            assert rest.decode().rstrip().endswith("bcd node: stopped")
            assert not root.paths.socket.exists()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()
        gateway.stop()


async def test_status_without_a_running_agent_says_how_to_start_it(tmp_path: Path) -> None:
    result = await anyio.run_process([BCD, "status"], env={"BCD_ROOT": str(tmp_path),
                                                            "PATH": os.environ["PATH"]},
                                     check=False)
    assert result.returncode == 11  # unavailable: start it, then it answers
    assert b"bcd node is not running" in result.stderr and b"systemctl start bcd" in result.stderr


async def test_a_copied_config_without_the_node_key_cannot_connect(tmp_path: Path) -> None:
    bundle = pki.generate_bundle()
    (tmp_path / "gw").mkdir()
    async with anyio.create_task_group() as group:
        gateway = FakeGateway(bundle, None, tmp_path / "gw")  # type: ignore[arg-type]
        port = await group.start(gateway.serve)
        root = make_node_root(tmp_path / "n", bundle, f"tls://127.0.0.1:{port}")
        root.paths.node_key.unlink()  # the config and certificate, stolen; the key stayed home
        result = await anyio.run_process([BCD, "node"], env=_env(root.paths.root, root.gpu_file),
                                         check=False)
        assert result.returncode == 1
        assert b"node key" in result.stderr and b"missing" in result.stderr
        assert gateway.hellos == []
        gateway.stop()
