"""The serving key never stays on disk (docs/security.md, "Serving certificate").

``serve`` issues its TLS key from the serving CA at every start and hands it to uvicorn
through a file under ``DATA_DIR/run/`` (the ssl module reads nothing else). The file goes as
soon as the TLS context has read it: none is there while the server serves, nor after any
exit (SIGTERM, SIGINT, SIGKILL, a start that fails; one process or ``--workers 2``). A file
left by a process killed in the moment between writing and reading it is removed by the
next start, but only when that process no longer runs.

The store plays no part here: SQLite only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_serve_workers import _children
from tests.support import CLI, free_port, initialize, serve, store_env


def _dead_pid() -> int:
    """The id of a process that has ended (its parent reaped it)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _keys(run: Path) -> list[str]:
    """Everything in ``run``: the serving files, the gateway's folders."""
    return sorted(p.name for p in run.iterdir()) if run.exists() else []


def test_serving_keys_go_once_read_and_stale_ones_of_dead_processes_at_start(
        tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    run = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "run"
    run.mkdir(mode=0o700, exist_ok=True)
    dead, live = _dead_pid(), os.getpid()
    for pid in (dead, live):  # as a kill -9 between writing and reading would leave them
        (run / f"serving-{pid}.key").write_text("a key")
        (run / f"serving-{pid}.crt").write_text("a certificate")
        (run / f"gateway-{pid}-x1y2").mkdir()
        (run / f"gateway-{pid}-x1y2" / "gateway.key").write_text("a key")
    kept = [f"gateway-{live}-x1y2", f"serving-{live}.crt", f"serving-{live}.key"]  # it runs
    for stop, workers in ((signal.SIGTERM, "1"), (signal.SIGINT, "1"), (signal.SIGKILL, "1"),
                          (signal.SIGTERM, "2")):
        gateway = ("--gateway-listen", f"127.0.0.1:{free_port()}") if workers == "2" else ()
        with serve(env, "--hostname", "localhost", *gateway, workers=workers) as server:
            pids = [server.process.pid, *(_children(server.process.pid)
                                          if workers != "1" else [])]
            assert _keys(run) == kept, f"while serving ({workers} worker(s))"
            server.kill(stop)
        assert _keys(run) == kept, f"after {signal.Signals(stop).name} ({workers} worker(s))"
        assert all(not (run / f"serving-{pid}.key").exists() for pid in pids)
    # A start that fails (its port is taken) exits with status 1 and leaves no key either.
    with socket.socket() as taken:
        port = free_port()
        taken.bind(("127.0.0.1", port))
        taken.listen()
        failed = subprocess.run([CLI, "serve", "--listen", f"127.0.0.1:{port}", "--hostname",
                                 "localhost", "--workers", "1"], env=env, capture_output=True,
                                text=True, timeout=120)
    assert failed.returncode != 0, failed.stdout
    assert _keys(run) == kept
