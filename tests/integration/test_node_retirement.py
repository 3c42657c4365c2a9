"""Drain, remove and re-join through the services, on SQLite and PostgreSQL.

The real-process version (bcd told it was removed, the machine joining
again) is tests/e2e/test_node_retirement_e2e.py. Time is the service's clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.services.join import machine_node_uuid
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import Conflict, NoCapacity, PermissionDenied
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from better_compute.domain.node_rules import placement_eligible
from tests.fleet import build_node
from tests.integration.test_join_service import Plane
from tests.integration.test_reservations_service import reserve, setup
from tests.join_client import JoinAttempt, hardware
from tests.support import POLICY, initialize, open_runtime


def head(runtime: Any) -> int:
    return int(runtime.store.recorder.max_notification_id() or 0)


def node_events(runtime: Any, node_id: str) -> list[str]:
    return [e["type"] for e in runtime.services.nodes.events(OP, node_id)]


def test_placement_eligibility_is_one_rule() -> None:
    gpus = [{"uuid": "GPU-1", "healthy": True}]
    assert placement_eligible("adopted", "connected", False, False, gpus)
    assert placement_eligible("adopted", "disconnected", False, False, gpus)
    for state, session, cordoned, draining, these in [
        ("adopting", "connected", False, False, gpus), ("removed", "never", False, False, gpus),
        ("adopted", "unreachable", False, False, gpus), ("adopted", "connected", True, False, gpus),
        ("adopted", "connected", False, True, gpus),
        ("adopted", "connected", False, False, [{"uuid": "GPU-1", "healthy": False}]),
    ]:
        assert not placement_eligible(state, session, cordoned, draining, these)


def test_a_draining_node_keeps_its_holds_takes_nothing_new_and_is_drained_when_they_end(
        runtime: Any) -> None:
    rs, clock, pool, [node_id] = setup(runtime, nodes=1, quota=None)
    nodes = runtime.services.nodes
    now = reserve(rs, pool, 4)
    later = reserve(rs, pool, 2, start="+3h", duration="1h")
    ReservationTimers(rs).tick()  # the hold of `now` enters the node's desired state
    drained = nodes.drain(OP, node_id, "replace a PSU")
    assert drained["maintenance"]["state"] == "draining"
    assert drained["maintenance"]["reason"] == "replace a PSU"
    schedulable = {c["type"]: c for c in drained["conditions"]}["Schedulable"]
    assert (schedulable["status"], schedulable["reason"]) == ("False", "Draining")
    with pytest.raises(NoCapacity):  # no new placement, now or later
        reserve(rs, pool, 1)
    with pytest.raises(NoCapacity):
        reserve(rs, pool, 1, start="+5h")
    held = runtime.store.repository.get(parse_id("node", node_id)).device_assignments()
    assert [h["reservationId"] for h in held] == [now["id"]]  # the hold stays
    gpu = nodes.capacity(OP, pool)["resources"]["gpu"]
    assert (gpu["maintenance"], gpu["allocated"], gpu["available"]) == (8, 4, 0)

    rs.release(OP, now["id"])
    assert nodes.get(OP, node_id)["maintenance"]["state"] == "draining"  # `later` is booked
    clock.advance(hours=3)
    ReservationTimers(rs).tick()  # the future booking becomes a hold on the draining node
    assert rs.get_doc(OP, later["id"])["state"] == "binding"
    rs.release(OP, later["id"])
    done = nodes.get(OP, node_id)
    assert done["maintenance"]["state"] == "drained" and done["maintenance"]["drainedAt"]
    assert node_events(runtime, node_id)[-1] == "node.drained"
    assert nodes.drain(OP, node_id, "again")["maintenance"]["state"] == "drained"  # no-op
    assert nodes.uncordon(OP, node_id)["maintenance"]["state"] == "none"
    assert reserve(rs, pool, 1)["nodeId"] == node_id  # eligible again


def test_a_node_with_nothing_held_is_drained_at_once(runtime: Any) -> None:
    _, _, _, [node_id] = setup(runtime, nodes=1, quota=None)
    done = runtime.services.nodes.drain(OP, node_id, None)
    assert done["maintenance"]["state"] == "drained"
    assert node_events(runtime, node_id)[-2:] == ["node.draining", "node.drained"]


def test_remove_is_refused_while_anything_is_held_and_force_releases_first(
        runtime: Any) -> None:
    rs, _, pool, [node_id] = setup(runtime, nodes=1, quota=6)
    nodes = runtime.services.nodes
    from tests.integration.test_reservations_service import ACME

    now = reserve(rs, pool, 4, who=ACME)
    later = reserve(rs, pool, 2, who=ACME, start="+3h", duration="1h")
    ReservationTimers(rs).tick()
    before = head(runtime)
    with pytest.raises(Conflict, match="holds or has booked 2 reservations") as refused:
        nodes.remove(OP, node_id, "retired", force=False)
    assert now["id"] in refused.value.message and "--force" in refused.value.message
    assert head(runtime) == before  # nothing changed

    removed = nodes.remove(OP, node_id, "retired", force=True)
    assert removed["provisionState"] == "removed"
    assert sorted(removed["removal"]["releasedReservations"]) == sorted([now["id"], later["id"]])
    assert removed["removal"]["revokedCertificateSerial"] == "1"
    for rsv in (now, later):
        doc = rs.get_doc(OP, rsv["id"])
        assert doc["state"] == "released"
    assert rs.preview(ACME, tenant_id=None, pool_id=pool, gpus=1, duration="1h")["quota"] \
        == {"gpu": 6, "inUse": 0}  # refunded
    from better_compute.api.store.eventlog import EventFilter, EventLog

    log = EventLog(runtime.store).page(EventFilter(), before, 1000).entries
    types = [e.type for e in log]
    assert types.index("node.removed") == len(types) - 1  # the releases come first
    assert types.count("reservation.released") == 2 and types.count("bookings.ended") == 2
    released = [e for e in log if e.type == "reservation.released"]
    assert all(b'"reason":"node-removed"' in e.line for e in released)
    capacity = nodes.capacity(OP, pool)
    assert capacity["resources"]["gpu"]["total"] == 0 and capacity["nodes"]["total"] == 0
    assert nodes.list(OP, None, pool) == []  # removed nodes are listed only when asked for
    assert [n["provisionState"] for n in nodes.list(OP, None, pool, include_removed=True)] \
        == ["removed"]
    with pytest.raises(Conflict, match="already removed"):
        nodes.remove(OP, node_id, None, force=True)
    with pytest.raises(Conflict, match="removed"):
        nodes.drain(OP, node_id, None)


@pytest.fixture
def plane(env: dict[str, str]) -> Iterator[Plane]:
    initialize(env)
    runtime = open_runtime(env)
    service = runtime.service
    site = service.sites_create(OP, "shared", "eu-1", None, "site-eu-1")["id"]
    pool = service.pools_create(OP, site, "metal-host", "H100", POLICY, None, "pool-h100")["id"]
    yield Plane(runtime, runtime.services.join, pool, site, service.pki().public)
    runtime.close()


def test_a_machine_is_one_node_and_gets_its_removed_node_back(plane: Plane) -> None:
    from tests.join_client import open_response

    runtime = plane.runtime
    nodes = runtime.services.nodes
    _, first_token = plane.mint(expect_serial="SN-7701")
    joined = open_response(plane.join(JoinAttempt(first_token, hardware(serial="SN-7701"))),
                           plane.public)
    node_id = joined.node_id
    pin = nodes.get(OP, node_id)["keyPin"]

    again_id, again = plane.mint(expect_serial="SN-7701", max_uses=2)
    before = head(runtime)
    with pytest.raises(Conflict, match=f"already joined as node {node_id}") as refused:
        plane.join(JoinAttempt(again, hardware(serial="SN-7701")))
    assert refused.value.data == {"nodeId": node_id}
    assert "nodes remove" in refused.value.message
    assert head(runtime) == before and plane.token(again_id)["uses"] == 0  # nothing spent

    nodes.remove(OP, node_id, "re-imaged", force=False)
    back = open_response(plane.join(JoinAttempt(again, hardware(serial="SN-7701"))),
                         plane.public)
    assert back.node_id == node_id  # the same node, not a second one
    doc = nodes.get(OP, node_id)
    assert doc["provisionState"] == "adopting" and doc["removal"] is None
    assert doc["keyPin"] != pin and doc["joinTokenId"] == again_id
    assert [n["id"] for n in plane.nodes()] == [node_id]
    assert node_events(runtime, node_id)[-2:] == ["node.removed", "node.rejoined"]
    assert plane.token(again_id)["uses"] == 1


def test_a_removed_node_rejoins_only_its_own_tenant(plane: Plane) -> None:
    runtime = plane.runtime
    runtime.service.tenants_create(OP, "acme", None)
    theirs = build_node(plane.pool, "acme")
    uuid = machine_node_uuid("serial:SN-4242", runtime.service.id_namespace())
    node = Node(id=uuid, tenant_id="acme", pool_id=plane.pool, site_id=plane.site,
                join_token_id="jt_x", role="node", hardware_key="serial:SN-4242",
                hardware=theirs.hardware, gpus=theirs.gpus, key_pin="sha256/x",
                certificate_serial="1", certificate_not_after=runtime.service.clock(),
                bcd_version="test")
    node.remove(runtime.service.clock(), None, "moved", [])
    runtime.store.save(node, actor="local")
    token_id, secret = plane.mint(expect_serial="SN-4242")
    with pytest.raises(PermissionDenied, match="another tenant"):
        plane.join(JoinAttempt(secret, hardware(serial="SN-4242")))
    assert plane.token(token_id)["uses"] == 0
