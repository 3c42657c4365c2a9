"""The fast service tier: the services as the composition root builds them, on a throwaway
SQLite store in a temp dir (no server, no PostgreSQL). Integration tests run them on both
backends; these check the wiring and the shared unit of work in a second or two."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from better_compute.api.gateway.journal import journal_handlers
from better_compute.api.runtime import Runtime
from better_compute.api.services import unit
from better_compute.api.services.unit import RETRY_ATTEMPTS
from better_compute.api.store.eventlog import EventLog, filter_for
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.base import TenantOwned
from better_compute.domain.errors import Conflict, PermissionDenied
from better_compute.domain.ids import parse_id
from better_compute.domain.pool import Pool
from tests.fleet import add_nodes, make_pool
from tests.support import open_runtime, quick_init, store_env


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    runtime = open_runtime(store_env("sqlite", tmp_path))
    quick_init(runtime)
    yield runtime
    runtime.close()


def test_every_service_is_built_once_over_one_unit_of_work(rt: Runtime) -> None:
    s = rt.services
    assert rt.service is s.compute and s.tokens is s.compute.tokens
    for service in (s.nodes, s.join, s.reservations):
        assert service.service is s.compute
    assert s.reservations.aggregates is s.aggregates is s.compute.aggregates
    assert s.compute.master_key_text is not None  # passed in, not attached later


def test_reserve_records_the_placement(rt: Runtime) -> None:
    pool = make_pool(rt.service)
    add_nodes(rt.service, pool, 1)
    doc = rt.services.reservations.create(OP, tenant_id=None, pool_id=pool, gpus=2,
                                          duration="1h")
    page = EventLog(rt.store).page(filter_for(OP, "reservation.placed"), 0, 10)
    placed = [json.loads(entry.line) for entry in page.entries]
    assert [e["subject"] for e in placed] == [doc["id"]]
    assert len(doc["gpus"]) == 2


def test_the_journal_handlers_are_registered_from_the_services(rt: Runtime) -> None:
    assert set(journal_handlers(rt.services)) == {
        "acceptance.result", "allocation.bound", "allocation.failed", "allocation.released"}


def test_a_call_acts_on_its_own_tenant(rt: Runtime) -> None:
    acme = Principal("acme", Role.ADMIN, "tok_a")
    assert rt.services.aggregates.scope(acme, None) == "acme"
    with pytest.raises(PermissionDenied, match="cannot act on tenant beta"):
        rt.services.aggregates.scope(acme, "beta")


def test_the_retry_policy_runs_a_change_again_then_gives_up(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unit, "RETRY_WITHIN_S", 0.0)  # the count alone decides here
    aggregates = rt.services.aggregates
    pool_id = make_pool(rt.service)
    rt.service.tenants_create(OP, "acme", None)
    uuid = parse_id("pool", pool_id)
    stale = aggregates.get(Pool, uuid)
    fresh = aggregates.get(Pool, uuid)
    assert stale is not None and fresh is not None
    version = stale.version
    fresh.offer("acme", {"gpu": 1})
    aggregates.save(fresh, actor="local")  # another writer got there first
    runs: list[int] = []

    def always_stale() -> list[TenantOwned]:
        runs.append(1)
        copy: Any = rt.store.repository.get(uuid, version=version)  # read before the clash
        copy.offer("acme", {"gpu": len(runs) + 1})
        return [copy]

    with pytest.raises(Conflict, match="nothing was saved"):
        aggregates.retrying(always_stale, actor="local")
    assert len(runs) == RETRY_ATTEMPTS
    assert aggregates.get(Pool, uuid).to_doc()["offerings"][0]["quota"] == {"gpu": 1}  # type: ignore[union-attr]

    runs.clear()

    def stale_then_fresh() -> list[TenantOwned]:
        runs.append(1)
        copy: Any = (rt.store.repository.get(uuid, version=version) if len(runs) == 1
                     else aggregates.get(Pool, uuid))
        copy.offer("acme", {"gpu": 5})
        return [copy]

    aggregates.retrying(stale_then_fresh, actor="local")
    assert len(runs) == 2
    assert aggregates.get(Pool, uuid).to_doc()["offerings"][0]["quota"] == {"gpu": 5}  # type: ignore[union-attr]


def test_the_retry_policy_runs_a_change_again_past_its_count_within_its_seconds(
        rt: Runtime) -> None:
    """A change that clashes more than ``RETRY_ATTEMPTS`` times in a row, within
    ``RETRY_WITHIN_S`` seconds, is still saved (a hot aggregate on a loaded machine)."""
    aggregates = rt.services.aggregates
    pool_id = make_pool(rt.service)
    rt.service.tenants_create(OP, "acme", None)
    uuid = parse_id("pool", pool_id)
    stale = aggregates.get(Pool, uuid)
    assert stale is not None
    version = stale.version
    fresh = aggregates.get(Pool, uuid)
    assert fresh is not None
    fresh.offer("acme", {"gpu": 1})
    aggregates.save(fresh, actor="local")  # another writer got there first
    runs: list[int] = []

    def stale_many_times() -> list[TenantOwned]:
        runs.append(1)
        copy: Any = (rt.store.repository.get(uuid, version=version)
                     if len(runs) <= RETRY_ATTEMPTS + 5 else aggregates.get(Pool, uuid))
        copy.offer("acme", {"gpu": 7})
        return [copy]

    aggregates.retrying(stale_many_times, actor="local")
    assert len(runs) == RETRY_ATTEMPTS + 6
    assert aggregates.get(Pool, uuid).to_doc()["offerings"][0]["quota"] == {"gpu": 7}  # type: ignore[union-attr]
