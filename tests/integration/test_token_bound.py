"""A tenant's live API tokens are bounded (``tokens.max_per_tenant``).

Each token has its own share of a server's workers (api/http/http_limits.py) and its own
aggregate and listing row, so a tenant admin may not mint as many as it likes: a create past
the bound is refused with ``quota_exceeded`` (``data.per``: ``tokens``)
and changes nothing; revoked and expired tokens do not count; other tenants are not
affected; the root tenant (the platform's operators) is not bounded.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from better_compute.api.services import unit
from better_compute.api.services.tokens import TokenExpiry
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import QuotaExceeded
from better_compute.domain.ids import parse_id
from better_compute.projections.listings import query_listing
from tests.support import open_runtime, quick_init

BOUND = 3


@pytest.fixture
def bounded(env: dict[str, str]) -> Any:
    rt = open_runtime({**env, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT": str(BOUND)})
    quick_init(rt)
    for tenant in ("acme", "beta"):
        rt.service.tenants_create(OP, tenant, None)
    yield rt
    rt.close()


def test_a_tenant_holds_at_most_the_bound_of_live_tokens(bounded: Any) -> None:
    tokens = bounded.services.tokens
    admin_doc = tokens.create(OP, "acme", "admin", "admin")
    admin = Principal("acme", Role.ADMIN, admin_doc["id"])
    made = [admin_doc] + [tokens.create(admin, None, "member", f"ci {n}")
                          for n in range(BOUND - 1)]
    head = bounded.store.recorder.max_notification_id()

    with pytest.raises(QuotaExceeded) as refused:
        tokens.create(admin, None, "member", "one too many")
    assert refused.value.data == {"per": "tokens", "tokens": BOUND, "limit": BOUND}
    assert f"tenant acme already has {BOUND} live tokens" in refused.value.message
    assert "tokens.max_per_tenant" in refused.value.message
    assert "tokens revoke" in refused.value.message  # the fix
    assert bounded.store.recorder.max_notification_id() == head  # nothing changed

    # Another tenant, and root, are not held back.
    tokens.create(OP, "beta", "member", None)
    assert all(tokens.create(OP, None, "member", None) for _ in range(BOUND + 1))

    # A revoked token's place comes back.
    tokens.revoke(admin, made[-1]["id"])
    assert tokens.create(admin, None, "member", "again")["tenantId"] == "acme"


def test_expired_tokens_do_not_count(bounded: Any) -> None:
    tokens = bounded.services.tokens
    for n in range(BOUND):
        tokens.create(OP, "acme", "member", f"short {n}", ttl="1m")
    clock = bounded.service.clock
    later = clock() + timedelta(minutes=2)
    bounded.service.clock = lambda: later
    try:
        assert tokens.create(OP, "acme", "member", "after")["state"] == "active"
    finally:
        bounded.service.clock = clock


def test_zero_is_no_bound(env: dict[str, str]) -> None:
    rt = open_runtime({**env, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT": "0"})
    try:
        quick_init(rt)
        rt.service.tenants_create(OP, "acme", None)
        assert all(rt.services.tokens.create(OP, "acme", "member", None)
                   for _ in range(BOUND + 2))
    finally:
        rt.close()


def test_neither_the_bound_nor_the_expiry_pass_reads_the_tokens_that_ended(
        bounded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Revoked and expired tokens only grow: a tenant admin who mints and revokes in a loop
    made every later ``tokens create`` of the tenant, and the tokens controller's pass (every
    30 s, all tenants), read all of them (the listing of every token ever made). Now both
    read only the tokens still live (projections/listings.py, ``bc_live_token``)."""

    tokens = bounded.services.tokens
    admin_doc = tokens.create(OP, "acme", "admin", "admin")
    admin = Principal("acme", Role.ADMIN, admin_doc["id"])
    for n in range(20):
        tokens.revoke(admin, tokens.create(admin, None, "member", f"brief {n}")["id"])
    read: list[tuple[str, int]] = []
    listing = query_listing  # what the service reads the listings with (api/services/unit.py)

    def spy(sql: Any, kind: str, **filters: Any) -> list[dict[str, Any]]:
        docs = listing(sql, kind, **filters)
        read.append((kind, len(docs)))
        return docs

    monkeypatch.setattr(unit, "query_listing", spy)
    made = [tokens.create(admin, None, "member", f"kept {n}") for n in range(BOUND - 1)]
    with pytest.raises(QuotaExceeded):  # the bound still counts the live ones: 3 of 3
        tokens.create(admin, None, "member", "one too many")
    expiry = TokenExpiry(tokens)
    assert expiry.tick() == []
    assert read == [], f"listing rows read: {read}"
    assert len(made) == BOUND - 1


def _live_rows(runtime: Any) -> set[tuple[str, str]]:
    sql = runtime.projections.sql
    runtime.projections.catch_up("listings")
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid, tenant_id FROM bc_live_token")
        return {(str(row["uuid"]), str(row["tenant_id"])) for row in cursor.fetchall()}


def test_the_live_tokens_are_those_recorded_active_or_rotated_and_a_rebuild_agrees(
        bounded: Any) -> None:

    tokens = bounded.services.tokens
    kept = tokens.create(OP, "acme", "member", "kept")
    rotated = tokens.create(OP, "acme", "member", "rotated")
    successor = tokens.rotate(OP, rotated["id"], None, None)
    revoked = tokens.create(OP, "beta", "member", "revoked")
    tokens.revoke(OP, revoked["id"])
    short = tokens.create(OP, "beta", "member", "short", ttl="1m")
    clock = bounded.service.clock
    later = clock() + timedelta(minutes=2)
    bounded.service.clock = lambda: later
    try:
        assert TokenExpiry(tokens).tick() == [short["id"]]
    finally:
        bounded.service.clock = clock

    def row(doc: dict[str, Any]) -> tuple[str, str]:
        return str(parse_id("tok", doc["id"])), str(doc["tenantId"])

    live = _live_rows(bounded)
    assert {row(kept), row(rotated), row(successor)} <= live
    assert not {row(revoked), row(short)} & live
    bounded.projections.rebuild("listings")
    assert _live_rows(bounded) == live
