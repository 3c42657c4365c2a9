"""Tenants, tokens, sites and pools: rules, ids and the events they record.

Aggregates are rebuilt from their own events here, which is what the store
does on every read: decorated bodies only assign, so a replay gives the same
object.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import pytest
from eventsourcing.domain import CanMutateAggregate

from better_compute.domain.base import TenantOwned, fingerprint
from better_compute.domain.errors import Conflict, InvalidInput
from better_compute.domain.events import event_type, public_event
from better_compute.domain.ids import (
    check_key,
    check_tenant_id,
    keyed_uuid,
    new_uuid,
    parse_id,
    public_id,
)
from better_compute.domain.pool import Pool, parse_quota
from better_compute.domain.site import Site
from better_compute.domain.tenant import Tenant, tenant_uuid
from better_compute.domain.token import ApiToken, token_hash, token_uuid
from tests.support import POLICY


def replay(aggregate: TenantOwned) -> tuple[Any, Sequence[CanMutateAggregate[UUID]]]:
    events = aggregate.collect_events()
    rebuilt: Any = None
    for event in events:
        rebuilt = event.mutate(rebuilt)
    return rebuilt, events


def make_pool(key: str | None = "pool-eu-1-h100", tenant: str = "root") -> Pool:
    return Pool(tenant_id=tenant, site_id="site_x", node_class="metal-host", gpu_model="H100",
                policy=POLICY, name="", key=key, fingerprint=fingerprint({"k": 1}))


# ---------------------------------------------------------------------------- ids


def test_public_ids_round_trip_and_have_no_dashes() -> None:
    value = new_uuid()
    text = public_id("pool", value)
    assert text.startswith("pool_") and len(text) == 5 + 26
    assert "-" not in text and text == text.lower()
    assert parse_id("pool", text) == value
    assert parse_id("pool", "pool_" + text[5:].upper()) == value  # case-insensitive tail


@pytest.mark.parametrize("text", ["pool_", "pool_abc", "site_" + "a" * 26, "pool" + "a" * 27,
                                  "", "pool-" + "a" * 26])
def test_malformed_ids_say_what_an_id_looks_like(text: str) -> None:
    with pytest.raises(InvalidInput, match="pool_ followed by 26 letters and digits"):
        parse_id("pool", text)


def test_an_id_of_the_right_shape_but_not_base32_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="pool_ followed by 26 letters and digits"):
        parse_id("pool", "pool_" + "1" * 26)


def test_only_the_canonical_spelling_of_an_id_is_accepted() -> None:
    text = public_id("pool", new_uuid())
    last = "b" if text[-1] != "b" else "c"  # the last character carries 2 unused bits
    sibling = text[:-1] + last
    try:
        value = parse_id("pool", sibling)
    except InvalidInput:
        return
    assert public_id("pool", value) == sibling


def test_keyed_ids_are_per_tenant_and_per_kind() -> None:
    assert keyed_uuid("root", "site", "k") == keyed_uuid("root", "site", "k")
    assert keyed_uuid("root", "site", "k") != keyed_uuid("acme", "site", "k")
    assert keyed_uuid("root", "site", "k") != keyed_uuid("root", "pool", "k")


@pytest.mark.parametrize("key", ["site-eu-1", "a", "x" * 128, "team/a:b@c.d_e"])
def test_valid_keys(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "-a", "a b", "x" * 129, "é"])
def test_invalid_keys(key: str) -> None:
    with pytest.raises(InvalidInput, match="idempotency key"):
        check_key(key)


@pytest.mark.parametrize("tenant", ["acme", "root", "a", "team-7"])
def test_valid_tenant_ids(tenant: str) -> None:
    assert check_tenant_id(tenant) == tenant


@pytest.mark.parametrize("tenant", ["Acme", "7up", "", "a_b", "a" * 41, "acme!"])
def test_invalid_tenant_ids(tenant: str) -> None:
    with pytest.raises(InvalidInput, match="not a valid tenant id"):
        check_tenant_id(tenant)


# ------------------------------------------------------------------ tenant, token


def test_tenant_ids_are_their_own_public_ids() -> None:
    tenant = Tenant(tenant_id="acme", name="Acme", created_by=None)
    assert tenant.id == tenant_uuid("acme") and tenant.public_id == "acme"
    rebuilt, events = replay(tenant)
    assert rebuilt.to_doc()["id"] == "acme" and rebuilt.name == "Acme"
    assert public_event(5, events[0])["subject"] == "acme"


def test_tokens_are_found_by_the_hash_of_their_secret_and_revoked_once() -> None:
    secret = "biam_example"
    token = ApiToken(tenant_id="acme", role="member", name="ci", secret_hash=token_hash(secret),
                     created_by=None)
    assert token.id == token_uuid(token_hash(secret))
    assert token.public_id.startswith("tok_") and not token.revoked
    token.revoke(datetime(2026, 1, 1, tzinfo=UTC), by="tok_x")
    with pytest.raises(Conflict, match="already revoked"):
        token.revoke(datetime(2026, 1, 2, tzinfo=UTC), by="tok_x")
    rebuilt, events = replay(token)
    assert rebuilt.revoked and rebuilt.to_doc()["revokedAt"] == "2026-01-01T00:00:00Z"
    assert [public_event(i, e)["type"] for i, e in enumerate(events)] == [
        "token.created", "token.revoked"]
    published = str([public_event(i, e) for i, e in enumerate(events)])
    assert token_hash(secret) not in published and secret not in published


# ------------------------------------------------------------------------- sites


def test_a_keyed_site_lands_on_the_same_id_and_checks_its_parameters() -> None:
    params = {"kind": "shared", "region": "eu-1", "name": ""}
    a = Site(tenant_id="root", kind="shared", region="eu-1", name="", key="site-eu-1",
             fingerprint=fingerprint(params))
    b = Site(tenant_id="root", kind="shared", region="eu-1", name="", key="site-eu-1",
             fingerprint=fingerprint(params))
    assert a.id == b.id
    a.check_retry(fingerprint(dict(params)), "site", "site-eu-1")
    with pytest.raises(Conflict, match="different parameters"):
        a.check_retry(fingerprint({**params, "region": "eu-2"}), "site", "site-eu-1")
    unkeyed = Site(tenant_id="root", kind="shared", region="eu-1", name="", key=None,
                   fingerprint=None)
    assert unkeyed.id != Site(tenant_id="root", kind="shared", region="eu-1", name="", key=None,
                              fingerprint=None).id


def test_site_events_publish_no_fingerprint() -> None:
    site = Site(tenant_id="root", kind="dedicated", region="eu-1", name="n", key="k",
                fingerprint="abc")
    rebuilt, events = replay(site)
    shown = public_event(1, events[0])
    assert shown["type"] == "site.created" and shown["subject"] == site.public_id
    assert shown["tenantId"] == "root"
    assert shown["data"] == {"kind": "dedicated", "region": "eu-1", "name": "n", "key": "k"}
    assert rebuilt.to_doc() == site.to_doc()


def test_fingerprints_ignore_key_order() -> None:
    assert fingerprint({"a": 1, "b": [1, 2]}) == fingerprint({"b": [1, 2], "a": 1})
    assert fingerprint({"a": 1}) != fingerprint({"a": 2})


# ------------------------------------------------------------------------- pools


def test_the_owner_has_an_unlimited_quota_and_others_none_until_offered() -> None:
    pool = make_pool()
    assert pool.quota_for("root") is None
    assert pool.quota_for("acme") == 0
    assert pool.visible_to("root") and not pool.visible_to("acme")
    assert pool.to_doc()["ownerQuota"] == {"gpu": "unlimited"}


def test_offering_records_one_event_per_change() -> None:
    pool = make_pool()
    assert pool.offer("acme", {"gpu": 16}) is True
    assert pool.offer("acme", {"gpu": 16}) is False  # the same offer again changes nothing
    assert pool.offer("globex", {"gpu": 8}) is True
    assert pool.offer("acme", {"gpu": 4}) is True
    rebuilt, events = replay(pool)
    assert [event_type(e) for e in events] == ["pool.created", "pool.offered", "pool.offered",
                                               "pool.offered"]
    assert rebuilt.quota_for("acme") == 4 and rebuilt.quota_for("globex") == 8
    assert rebuilt.visible_to("acme") and not rebuilt.visible_to("initech")
    assert public_event(2, events[1])["data"] == {"toTenant": "acme", "quota": {"gpu": 16}}


def test_the_owner_cannot_be_offered_its_own_pool() -> None:
    pool = make_pool(tenant="root")
    with pytest.raises(InvalidInput, match="effectively unlimited"):
        pool.offer("root", {"gpu": 1})
    assert event_type(pool.collect_events()[-1]) == "pool.created"


def test_a_tenant_sees_only_its_own_offering() -> None:
    pool = make_pool()
    pool.offer("acme", {"gpu": 16})
    pool.offer("globex", {"gpu": 8})
    assert pool.to_doc(viewer="acme")["offerings"] == [{"tenantId": "acme", "quota": {"gpu": 16}}]
    assert len(pool.to_doc(viewer="root")["offerings"]) == 2
    assert len(pool.to_doc()["offerings"]) == 2


@pytest.mark.parametrize("quota", [{"gpu": 16}, {"gpu": 0}])
def test_gpu_is_the_quota_resource(quota: dict[str, int]) -> None:
    assert parse_quota(quota) == quota


@pytest.mark.parametrize("quota,needle", [
    ({}, "needs a quota"),
    ({"gpus": 16}, "gpu (singular)"),
    ({"GPU": 16}, "is not known"),
    ({"gpu": 16, "cpu": 4}, "'cpu' is not known"),
    ({"gpu": -1}, "whole number"),
    ({"gpu": "16"}, "whole number"),
    ({"gpu": True}, "whole number"),
    ({"gpu": 1.5}, "whole number"),
])
def test_other_quota_resources_and_values_are_refused(quota: dict[str, Any], needle: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_quota(quota)
    assert needle in str(err.value)
