"""A ``serve --workers`` parent killed with SIGKILL leaves its metrics directory behind; the
next start removes it, and never a live server's (api/http/workers.py).

Real servers on one temp dir of the test's own (``TMPDIR``): A is killed with SIGKILL (its
workers die with it, its directory stays), B keeps serving, and a directory without an
owner lock (a run of an older version, or one being made) sits beside them. C's start
removes A's directory only, and says so; B's still serves its scrapes. Not about the
store: SQLite only (the directory is the same on PostgreSQL).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.e2e.test_serve_workers import _children, _gone
from tests.e2e.test_serve_workers_metrics import _multiprocess_dir
from tests.support import eventually, initialize, serve, store_env


def test_a_sigkilled_servers_metrics_directory_is_removed_at_the_next_start(
        tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**store_env("sqlite", tmp_path), "TMPDIR": str(temp)}
    initialize(env)
    unjudged = temp / "better-compute-metrics-older"
    unjudged.mkdir()
    (unjudged / "counter_1.db").write_bytes(b"")
    with serve(env, workers="2") as a, serve(env, workers="2") as b:
        a_workers, b_workers = _children(a.process.pid), _children(b.process.pid)
        a_dir, b_dir = _multiprocess_dir(a_workers[0]), _multiprocess_dir(b_workers[0])
        assert a_dir is not None and b_dir is not None and a_dir != b_dir
        assert a_dir.parent == temp and b_dir.parent == temp
        a.kill(signal.SIGKILL)
        eventually(lambda: all(_gone(w) for w in a_workers), "A's workers died with their parent")
        assert a_dir.is_dir()  # left behind: nothing ran to remove it
        log = tmp_path / "c.log"
        with serve(env, workers="2", log_file=log):
            assert not a_dir.exists()
            assert b_dir.is_dir() and any(b_dir.glob("*.db")), sorted(os.listdir(b_dir))
            assert unjudged.is_dir()
            text = log.read_text()
            assert f"removed {a_dir}, the metrics directory of a server that ended" in text, \
                text
            assert str(b_dir) not in text, text
        assert b.process.poll() is None  # B serves on
