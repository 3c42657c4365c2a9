"""Processes that open one store at the same moment all succeed (replicas starting together).

Opening a store creates its tables, functions and the projections' tables
when missing. On PostgreSQL, the same DDL run by several sessions at once
fails in some of them ("tuple concurrently updated"); on SQLite the library's
tracking-table migration (read, then insert in another transaction) let two of
them insert the same row (IntegrityError, seen under load). api/store/store.py's
``setup_lock`` lets one process at a time do it on both.
"""

from __future__ import annotations

from tests.forking import forker
from tests.support import initialize

OPENERS = 6

_OPEN = """
from better_compute.api.runtime import Runtime
Runtime.open().close()
print("opened")
"""


def _open_all_at_once(env: dict[str, str]) -> list[tuple[int, str, str]]:
    """OPENERS processes, forked at the same moment from one that imported the product."""
    with forker(env, "better_compute.api.runtime") as processes:
        children = processes.run(_OPEN, *([[]] * OPENERS))
    return [(c.returncode, c.stdout, c.stderr) for c in children]


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
