"""Processes that open one store at the same moment all succeed (replicas starting together).

Opening a store creates its tables, functions and the projections' tables
when missing. On PostgreSQL, the same DDL run by several sessions at once
fails in some of them ("tuple concurrently updated"); on SQLite the library's
tracking-table migration (read, then insert in another transaction) let two of
them insert the same row (IntegrityError, seen under load). api/store/store.py's
``setup_lock`` lets one process at a time do it on both.
"""

from __future__ import annotations

import subprocess
import sys

from tests.support import initialize

OPENERS = 6

# Imports first, then wait for the go line on stdin, so that every process opens at once.
_OPEN = """
import sys
from better_compute.api.runtime import Runtime
sys.stdin.readline()
Runtime.open().close()
print("opened")
"""


def _open_all_at_once(env: dict[str, str]) -> list[tuple[int, str, str]]:
    processes = [subprocess.Popen([sys.executable, "-c", _OPEN], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE) for _ in range(OPENERS)]
    results = []
    try:
        for process in processes:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            out, err = process.communicate(timeout=120)
            results.append((process.returncode, out, err))
    finally:
        for process in processes:
            process.kill()
    return results


def test_processes_opening_a_new_store_together_all_succeed(env: dict[str, str]) -> None:
    results = _open_all_at_once(env)
    assert [(code, out.strip()) for code, out, _ in results] == [(0, "opened")] * OPENERS, \
        [err.strip().splitlines()[-1:] for _, _, err in results]


def test_processes_opening_an_initialized_store_together_all_succeed(
        env: dict[str, str]) -> None:
    initialize(env)
    results = _open_all_at_once(env)
    assert [(code, out.strip()) for code, out, _ in results] == [(0, "opened")] * OPENERS, \
        [err.strip().splitlines()[-1:] for _, _, err in results]
