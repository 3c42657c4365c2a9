"""Every command records who did it: the actor on each event it saves (docs/events.md).

Each JSON-RPC method is either a COMMAND below, called through ``rpc.handle``
with a bearer token exactly as the HTTP endpoint runs it, after which every
new event must carry that token's id as its ``actor`` (``nodes.join``: the
join token's id), or a READ that saves nothing. A method in neither fails
``test_every_method_is_a_command_or_a_read``. The audit filters of
``events.list`` then find those events by actor, subject and time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from better_compute.api.http import rpc
from better_compute.api.runtime import Runtime
from better_compute.domain.ids import parse_id
from tests.integration.test_isolation import World, build_world, mint, sealed_join, with_fleet
from tests.support import POLICY, initialized_runtime

# Methods that save no event (the isolation cases check they leave the log alone).
READS = {
    "system.whoami", "rpc.discover", "pki.show", "tenants.get", "tenants.list", "tokens.list",
    "sites.get", "sites.list", "pools.get", "pools.list", "joinTokens.get", "joinTokens.list",
    "nodes.list", "nodes.get", "nodes.events", "capacity.get", "capacity.history",
    "capacity.preview",
    "reservations.get", "reservations.list", "events.list", "projections.status",
    "projections.rebuild", "usage.report",
}

Step = Callable[[World], tuple[str | None, dict[str, Any]]]  # -> (who, params)


def _join(w: World) -> tuple[str | None, dict[str, Any]]:
    minted = mint(w, "pool_root")
    w.ids["jt_join"] = minted["id"]
    sealed, _ = sealed_join(w, minted["token"], "SN-AUDIT")
    return None, {"sealed": sealed}


def _accept_inventory(w: World) -> tuple[str | None, dict[str, Any]]:
    """Root accepts what node_acme reports after a repair (recorded first, by its gateway)."""
    node = w.ids["node_acme"]
    gpus = w.ok("root", "nodes.get", nodeId=node)["gpus"]
    w.rt.services.inventory.reported(parse_id("node", node), 0,
                                     [*gpus[:-1], {**gpus[-1], "uuid": "GPU-after-repair"}])
    return "root", {"nodeId": node, "reason": "GPU replaced"}


def _rsv(w: World) -> tuple[str | None, dict[str, Any]]:
    return "acme-member", {"poolId": w.ids["pool_both"], "gpus": 1, "duration": "1h"}


# In order: later steps use what earlier ones made (w.ids["made:<method>"]).
COMMANDS: dict[str, Step] = {
    "tenants.create": lambda w: ("root", {"tenantId": "initech"}),
    "tokens.create": lambda w: ("acme-admin", {"role": "member", "ttl": "30d"}),
    "tokens.rotate": lambda w: ("acme-admin", {"tokenId": w.token_ids["acme-ro"]}),
    "tokens.revoke": lambda w: ("acme-admin", {"tokenId": w.ids["made:tokens.create"]}),
    "sites.create": lambda w: ("root", {"kind": "dedicated", "region": "eu-7"}),
    "pools.create": lambda w: ("root", {"siteId": w.ids["made:sites.create"],
                                        "class": "metal-host", "gpuModel": "H100",
                                        "policy": POLICY}),
    "pools.offer": lambda w: ("root", {"poolId": w.ids["made:pools.create"],
                                       "toTenantId": "acme", "quota": {"gpu": 2}}),
    "joinTokens.create": lambda w: ("root", {"poolId": w.ids["pool_root"], "ttl": "1h"}),
    "joinTokens.revoke": lambda w: ("root", {"joinTokenId": w.ids["made:joinTokens.create"]}),
    "nodes.join": _join,
    "nodes.adopt": lambda w: ("acme-admin", {"nodeId": w.ids["node_acme_new"]}),
    "nodes.acceptInventory": _accept_inventory,
    "nodes.cordon": lambda w: ("acme-admin", {"nodeId": w.ids["node_acme"], "reason": "x"}),
    "nodes.uncordon": lambda w: ("acme-admin", {"nodeId": w.ids["node_acme"]}),
    "nodes.drain": lambda w: ("acme-admin", {"nodeId": w.ids["node_acme"]}),
    "nodes.remove": lambda w: ("acme-admin", {"nodeId": w.ids["node_acme"]}),
    "reservations.create": _rsv,
    "reservations.extend": lambda w: ("acme-member", {
        "reservationId": w.ids["made:reservations.create"], "by": "30m"}),
    "reservations.release": lambda w: ("acme-member", {
        "reservationId": w.ids["made:reservations.create"]}),
    "reservations.cancel": lambda w: ("acme-member", {
        "reservationId": w.ids["rsv_acme_later"]}),
}


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[Runtime]:
    rt = initialized_runtime(env)  # with the master key nodes.join needs
    yield rt
    rt.close()


def test_every_method_is_a_command_or_a_read() -> None:
    methods = set(rpc.METHODS)
    assert not set(COMMANDS) & READS
    missing = methods - set(COMMANDS) - READS
    assert not missing, (f"methods with no actor check: {sorted(missing)}: add each to COMMANDS "
                         "(it saves events) or READS (it saves none) in this file")
    assert set(COMMANDS) | READS <= methods, (set(COMMANDS) | READS) - methods


def test_every_command_records_its_actor_on_every_event(runtime: Any) -> None:
    w = build_world(runtime)
    with_fleet(w)
    w.token_ids["root"] = runtime.service.authenticate(w.tokens["root"]).token_id
    seen_types: set[str] = set()
    for method, step in COMMANDS.items():
        who, params = step(w)
        before = w.head()
        result = w.ok(who, method, **params)
        if isinstance(result, dict) and isinstance(result.get("id"), str):
            w.ids[f"made:{method}"] = result["id"]
        page = w.ok("root", "events.list", since=before, limit=1000)
        assert page["events"], f"{method} saved no event"
        actor = w.ids["jt_join"] if method == "nodes.join" else w.token_ids[str(who)]
        wrong = [(e["type"], e["actor"]) for e in page["events"] if e["actor"] != actor]
        assert not wrong, f"{method} by {actor}: events with another actor {wrong}"
        seen_types |= {e["type"] for e in page["events"]}
    assert {"token.rotated", "node.draining", "node.removed", "reservation.released",
            "joinToken.used", "node.joined", "node.inventory.accepted",
            "gpu.claimed"} <= seen_types


def test_the_audit_filters_find_events_by_actor_subject_and_time(runtime: Any) -> None:
    w = build_world(runtime)
    with_fleet(w)
    everything = w.ok("root-ro", "events.list", limit=1000)["events"]
    acme_member = w.token_ids["acme-member"]
    by_actor = w.ok("root", "events.list", actor=acme_member, limit=1000)["events"]
    assert by_actor and {e["actor"] for e in by_actor} == {acme_member}
    assert [e["sequence"] for e in by_actor] == [
        e["sequence"] for e in everything if e["actor"] == acme_member]
    rsv = w.ids["rsv_acme"]
    about = w.ok("acme-ro", "events.list", subject=rsv, limit=1000)["events"]
    assert about and {e["subject"] for e in about} == {rsv}
    assert about[0]["type"] == "reservation.placed"
    # A tenant's filter never widens what it sees: globex finds nothing of acme's.
    assert w.ok("globex-admin", "events.list", actor=acme_member, limit=1000)["events"] == []
    assert w.ok("globex-admin", "events.list", subject=rsv, limit=1000)["events"] == []
    # Time: [from, to) on the event's time.
    middle = everything[len(everything) // 2]["time"]
    after = w.ok("root", "events.list", limit=1000, **{"from": middle})["events"]
    before = w.ok("root", "events.list", limit=1000, to=middle)["events"]
    assert after and before
    assert {e["sequence"] for e in after} | {e["sequence"] for e in before} == {
        e["sequence"] for e in everything}
    assert all(_t(e["time"]) >= _t(middle) for e in after)
    assert all(_t(e["time"]) < _t(middle) for e in before)
    assert w.ok("root", "events.list", limit=1000, **{"from": "-1h"})["events"] == everything
    assert w.ok("root", "events.list", limit=1000, to="2000-01-01")["events"] == []
    for bad in ({"from": "yesterday"}, {"from": "2031-01-02", "to": "2031-01-01"},
                {"actor": ""}):
        w.refused("root", "events.list", "invalid_input", **bad)


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_save_without_an_actor_is_refused_and_saves_nothing(runtime: Any) -> None:
    """Who did it is never left out: a save whose events carry no actor is refused whole."""
    from better_compute.api.store.actor import MissingActor
    from better_compute.domain.site import Site

    def sites() -> list[Site]:
        return [Site(tenant_id="root", kind="shared", region=f"eu-{i}", name="", key=None,
                     fingerprint="") for i in range(2)]

    before = runtime.store.recorder.max_notification_id() or 0
    with pytest.raises(MissingActor, match=r"site\.created .* has no actor"):
        runtime.store.save(*sites(), actor=None)
    assert (runtime.store.recorder.max_notification_id() or 0) == before
    runtime.store.save(*sites(), actor="local")  # the same save with its actor goes through
    assert runtime.store.recorder.max_notification_id() == before + 2
