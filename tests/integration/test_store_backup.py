"""store backup, restore and verify: a consistent copy taken during writes, restored whole.

SQLite stores are copied with SQLite's online backup API while a writer keeps
saving; the copy, restored into a fresh data dir, holds exactly the live
log up to its head (no hole), verifies, and shows the same capacity. On
PostgreSQL, backup names the pg_dump command instead. `store verify` finds a
deleted event and a read model that drifted.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from better_compute.api.runtime import Runtime
from better_compute.api.store.eventlog import EventFilter, EventLog
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.reservation_rules import cdi_devices
from tests.conftest import BACKENDS
from tests.fleet import add_nodes, make_pool
from tests.support import cli_inprocess, initialize, open_runtime
from tests.watching import write_sites


def lines(rt: Runtime, upto: int | None = None) -> list[bytes]:
    log = EventLog(rt.store)
    out: list[bytes] = []
    since = 0
    while True:
        page = log.page(EventFilter(), since, 1000)
        out += [e.line for e in page.entries]
        if not page.more:
            break
        since = page.next
    return [line for line in out if upto is None or json.loads(line)["sequence"] <= upto]


def fleet(env: dict[str, str]) -> tuple[Runtime, str]:
    initialize(env)
    rt = open_runtime(env)
    pool = make_pool(rt.service)
    add_nodes(rt.service, pool, 2)
    rs = rt.services.reservations
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=4, duration="2h")
    rs.create(OP, tenant_id=None, pool_id=pool, gpus=2, duration="1h", start="+3h")
    return rt, pool


def cli(env: dict[str, str], *argv: str) -> tuple[int, Any, str]:
    code, out, err = cli_inprocess(list(argv), env)
    return code, json.loads(out) if out.strip().startswith(("{", "[")) else out, err


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_backup_during_writes_restores_to_the_same_log_and_capacity(
        env: dict[str, str], tmp_path: Path) -> None:
    rt, pool = fleet(env)
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        while not stop.is_set():
            written.extend(write_sites(rt, 20, per_save=5, region="eu-9"))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 50:  # the writer is under way
            threading.Event().wait(0.01)
        code, first, err = cli(env, "store", "backup", "--out", str(tmp_path / "during.sqlite"))
        assert code == 0, err
        more = len(written)
        while len(written) < more + 50:  # and still writing after the copy
            threading.Event().wait(0.01)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert (tmp_path / "during.sqlite").stat().st_mode & 0o777 == 0o600
    assert min(written) < first["head"] < max(written)

    restored_env = {**env, "BETTER_COMPUTE_DATA_DIR": str(tmp_path / "restored")}
    code, done, err = cli(restored_env, "store", "restore", str(tmp_path / "during.sqlite"))
    assert code == 0, err
    assert "master key" in done["next"]  # a backup never holds it
    code, report, err = cli(restored_env, "store", "verify")
    assert code == 0 and report["ok"], (report["problems"], report["projections"], err)
    assert report["head"] == first["head"] and report["gaps"] == 0
    assert set(report["projections"]) == set(rt.projections.projections)
    back = open_runtime(restored_env)
    try:
        assert lines(back) == lines(rt, upto=first["head"])  # a prefix: nothing torn
    finally:
        back.close()

    # With the writes over, a backup holds exactly the live log and the same capacity.
    code, second, err = cli(env, "store", "backup", "--out", str(tmp_path / "after.sqlite"))
    assert code == 0, err
    code, _, err = cli(env, "store", "backup", "--out", str(tmp_path / "after.sqlite"))
    assert code == 6 and "never overwrites" in err  # conflict (docs/cli.md)
    again_env = {**env, "BETTER_COMPUTE_DATA_DIR": str(tmp_path / "again")}
    assert cli(again_env, "store", "restore", str(tmp_path / "after.sqlite"))[0] == 0
    code, _, err = cli(again_env, "store", "restore", str(tmp_path / "after.sqlite"))
    assert code == 6 and "fresh data dir" in err  # conflict
    back = open_runtime(again_env)
    try:
        assert second["head"] == rt.store.recorder.max_notification_id()
        assert lines(back) == lines(rt)
        assert back.services.nodes.capacity(OP, pool) == \
            rt.services.nodes.capacity(OP, pool)
        assert cli(again_env, "store", "verify")[0] == 0
    finally:
        back.close()
        rt.close()


def test_verify_reads_every_event_and_compares_every_read_model(env: dict[str, str]) -> None:
    rt, _ = fleet(env)
    try:
        rt.projections.catch_up()
        code, report, err = cli(env, "store", "verify")
        assert code == 0 and report["ok"], (report["problems"], report["projections"], err)
        assert report["events"] == report["head"] >= 16 and report["aggregates"] >= 8
        assert all(v.startswith("equal at position") for v in report["projections"].values())
        # A sum kept by adding and taking away (a node's 2015.56 GiB, cordoned and back) drifts
        # in its last bits from the rebuild's: the same figure, not a difference.
        with rt.projections.sql.transaction(commit=True) as cursor:
            rt.projections.sql.execute(cursor, "UPDATE bc_capacity_pool SET total = "
                                       "total + 0.0000000000005, maintenance = maintenance "
                                       "+ 0.0000000000005 WHERE resource = 'memory'")
        code, report, _ = cli(env, "store", "verify")
        assert code == 0 and report["ok"], report["problems"]
        # A read model that drifted from the log is found.
        with rt.projections.sql.transaction(commit=True) as cursor:
            rt.projections.sql.execute(cursor, "UPDATE bc_capacity_pool SET total = total + 1 "
                                       "WHERE resource = 'gpu'")
        code, report, _ = cli(env, "store", "verify")
        assert code == 1 and not report["ok"]
        assert report["projections"]["capacity"].startswith("differs")
        assert report["projections"]["listings"].startswith("equal")
        assert any("projections rebuild capacity" in p for p in report["problems"])
    finally:
        rt.close()


def test_verify_is_clean_after_a_reservation_is_placed_active_and_released(
        env: dict[str, str]) -> None:
    """The tutorial's steps, each caught up on its own (as a live server applies them): the
    read model's counts of (tenant, pool, state) went 1 and back to 0 for placed, binding and
    active, which a rebuild applying the log in one batch never writes: not a difference."""
    initialize(env)
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service)
        (node,) = add_nodes(rt.service, pool, 1)
        rs = rt.services.reservations
        rt.projections.catch_up()
        rsv = rs.create(OP, tenant_id=None, pool_id=pool, gpus=4, duration="2h")
        rt.projections.catch_up()
        assert rs.bound(node, {"allocationId": rsv["allocationId"],
                               "cdiDevices": cdi_devices(rsv["gpus"])}, actor=node)
        rt.projections.catch_up()
        assert rs.release(OP, rsv["id"])["state"] == "released"
        rt.projections.catch_up()
        code, report, err = cli(env, "store", "verify")
        assert code == 0 and report["ok"], (report, err)
    finally:
        rt.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_verify_finds_a_deleted_event(env: dict[str, str]) -> None:
    rt, _ = fleet(env)
    path = rt.config.sqlite_path
    rt.close()
    assert path is not None
    with sqlite3.connect(path) as db:
        victim = db.execute("SELECT rowid, originator_version FROM stored_events WHERE "
                            "originator_version = 2 ORDER BY rowid LIMIT 1").fetchone()
        db.execute("DELETE FROM stored_events WHERE rowid = ?", (victim[0],))
    code, report, _ = cli(env, "store", "verify")
    assert code == 1
    assert any(f"events {victim[0]}..{victim[0]}" in p for p in report["problems"])
    assert any("version 3" in p and "expected 2" in p for p in report["problems"])


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b == "postgres"])
def test_backup_on_postgresql_names_the_pg_dump_command(env: dict[str, str],
                                                        tmp_path: Path) -> None:
    initialize(env)
    code, _, err = cli(env, "store", "backup", "--out", str(tmp_path / "x.dump"))
    assert code == 2  # invalid_input: PostgreSQL is backed up with pg_dump
    schema = env["BETTER_COMPUTE_DATABASE_URL"].rsplit("schema=", 1)[1]
    assert f"pg_dump --format=custom --schema={schema} --file={tmp_path / 'x.dump'}" in err
    assert "pg_restore" in err and "PGPASSWORD" in err
    password = env["BETTER_COMPUTE_DATABASE_URL"].split("@")[0].rsplit(":", 1)[-1]
    if password and not password.startswith("//"):
        assert password not in err
    assert not (tmp_path / "x.dump").exists()
