"""Named locks across the processes of one store (api/store/locks.py), on both backends.

A real second process holds a lock: this process waits for it, and not for another name's;
a lock it cannot take in time (a holder stopped) is given up, and the caller goes on; a
PostgreSQL lock without a database is given up at once, never an error. That a tenant's
create and release take the store's lock and the owner's none: tests/integration/
test_quota_locks.py.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from better_compute.api.store import locks as locks_module
from better_compute.api.store.locks import AdvisoryLocks, locks_for
from better_compute.api.store.store import StoreConfig
from tests.conftest import BACKENDS
from tests.support import wait_for_line

HOLDER = r"""
import sys
from better_compute.api.store.store import StoreConfig
from better_compute.api.store.locks import locks_for
import os
locks = locks_for(StoreConfig.from_env(dict(os.environ)))
with locks.hold(sys.argv[1]) as taken:
    print("held" if taken else "not taken", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


def _holder(env: dict[str, str], name: str) -> subprocess.Popen[str]:
    process = subprocess.Popen([sys.executable, "-c", HOLDER, name], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    wait_for_line(process, "held")
    return process


def _release(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None
    process.stdin.write("go\n")
    process.stdin.flush()
    wait_for_line(process, "released")
    process.wait(timeout=30)


def test_a_lock_another_process_holds_is_waited_for_and_another_name_is_not(
        env: dict[str, str]) -> None:
    locks = locks_for(StoreConfig.from_env(env))
    holder = _holder(env, "quota/pool_a/acme")
    try:
        with locks.hold("quota/pool_a/globex") as taken:  # another name: no wait
            assert taken
        entered = threading.Event()

        def take() -> None:
            with locks.hold("quota/pool_a/acme") as ok:
                assert ok
                entered.set()

        waiter = threading.Thread(target=take)
        waiter.start()
        assert not entered.wait(0.5)  # the other process holds it
        _release(holder)
        waiter.join(timeout=30)
        assert entered.is_set()
    finally:
        holder.kill()
        locks.close()


def test_a_lock_not_had_in_time_is_given_up(env: dict[str, str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locks_module, "WAIT_S", 0.3)
    locks = locks_for(StoreConfig.from_env(env))
    holder = _holder(env, "quota/pool_a/acme")
    try:
        with locks.hold("quota/pool_a/acme") as taken:
            assert taken is False  # the caller goes on; the store still refuses a stale save
        _release(holder)
        with locks.hold("quota/pool_a/acme") as taken:
            assert taken is True
    finally:
        holder.kill()
        locks.close()


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "sqlite"])
def test_sqlite_locks_are_file_locks_with_no_connections_to_bound(env: dict[str, str]) -> None:
    locks = locks_for(StoreConfig.from_env(env))
    assert type(locks).__name__ == "FileLocks"
    locks.close()


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "postgres"])
def test_postgres_locks_take_at_most_their_connections_then_go_without(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    locks = locks_for(StoreConfig.from_env(env))
    assert isinstance(locks, AdvisoryLocks)
    monkeypatch.setattr(locks_module, "PG_CONNECTIONS", 1)
    try:
        with locks.hold("quota/pool_a/acme") as first:
            assert first is True
            with locks.hold("quota/pool_a/globex") as second:
                assert second is False  # no second connection: gone without, at once
        with locks.hold("quota/pool_a/globex") as again:
            assert again is True  # the first's connection, reused
    finally:
        locks.close()
    assert locks._open == 0


def test_a_postgres_lock_without_a_database_is_given_up_not_raised() -> None:
    locks = AdvisoryLocks({"POSTGRES_CONNINFO": "host=127.0.0.1 port=9 dbname=none "
                           "user=none connect_timeout=2"}, "public")
    with locks.hold("quota/pool_a/acme") as taken:
        assert taken is False
    locks.close()
