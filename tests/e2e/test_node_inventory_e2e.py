"""A node's hardware is what was accepted, not what it last said (docs/nodes.md, "What a node
may change"), with real processes.

A real ``serve --gateway-listen``; node B is a real ``bcd node`` on the fake GPU source,
adopted, with a reservation bound on it; node A is made by hand here: joined over HTTPS with
a key of its own (a valid node certificate), then speaking the gateway's protocol as a
hostile bcd would. Whatever A says, B's GPUs stay B's: capacity, bookings and B's holds do
not move, and each refusal is an event the operator sees. Then a real repair on B (a GPU
replaced: the fake source reports a new UUID) is refused until the operator runs
``nodes accept-inventory``, and capacity follows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from better_compute.api.wire import gateway as wire
from tests.cluster import Cluster, adopted_cluster
from tests.gateway_client import gpus
from tests.handmade_node import join_by_hand
from tests.support import CLI, eventually, run

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "2", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2",
        "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "600"}

T = TypeVar("T")


async def _off_loop(call: Callable[[], T]) -> T:
    """A blocking step (the CLI, a poll) in a thread, so the node's heartbeats go on."""
    return await anyio.to_thread.run_sync(call)


def _holds(c: Cluster, node: str) -> Any:
    """What the control plane has B hold and book: its assignments and its GPUs' owners."""
    doc = c.cli_json("nodes", "get", node)
    return doc["gpus"], doc["heldGpus"], doc["generation"]


def _log(c: Cluster, types: str) -> list[dict[str, Any]]:
    """``events list --types TYPES``: one JSON line per event."""
    return [json.loads(line) for line in c.cli("events", "list", "--types", types).splitlines()]


def _inventory_events(c: Cluster, node: str) -> list[dict[str, Any]]:
    return [e for e in c.cli_json("nodes", "events", node)
            if e["type"] == "node.inventory.mismatch"]


def test_a_node_cannot_take_another_nodes_gpus_and_a_repair_needs_the_operator(
        env: dict[str, str], tmp_path: Path) -> None:
    with adopted_cluster(env, tmp_path, FAST) as c:
        b = c.node
        b_gpus = [g["uuid"] for g in c.cli_json("nodes", "get", b, "--query", "gpus")]
        rsv = c.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h")
        assert rsv["state"] == "active" and rsv["nodeId"] == b
        before = (c.gpu_capacity(), _holds(c, b), c.cli_json("reservations", "get", rsv["id"]))
        client, a = join_by_hand(c, "SN-4242", tmp_path)

        async def heartbeats() -> None:
            while True:
                await anyio.sleep(1)
                await client.send(wire.Heartbeat(epoch=client.epoch, time="2030-01-01T00:00:00Z"))

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                desired = await client.connect()
                assert isinstance(desired, wire.Welcome)
                tg.start_soon(heartbeats)
                accept = await client.receive_desired(lambda d: "acceptance" in d.sections)
                attempt = accept.sections["acceptance"]["attempt"]
                # Its own 8, B's 8, one of its own 8 times more, 16 made up: 40 GPUs.
                mine = gpus(8, serial="SN-4242")
                theirs = [{**g, "index": 8 + i, "uuid": u}
                          for i, (g, u) in enumerate(zip(gpus(8), b_gpus, strict=True))]
                again = [{**mine[0], "index": 16 + i} for i in range(8)]
                made_up = [{**g, "index": 24 + i, "uuid": f"GPU-made-up-{i:02d}"}
                           for i, g in enumerate(gpus(16, serial="x"))]
                answer = await client.acceptance(attempt, mine + theirs + again + made_up)
                assert isinstance(answer, wire.Nack), answer
                assert answer.code == "inventory_mismatch", answer
                assert "40" in answer.message and b_gpus[0] in answer.message
                await _refused_and_nothing_moved(c, a, b, rsv["id"], before, "acceptance.result")
                # B's UUID in a later report of an adopted A: refused (recorded) likewise.
                await _off_loop(lambda: c.cli("api", "nodes.adopt", f"nodeId={a}",
                                              "reason=operator checked"))
                accept = await client.receive_desired(
                    lambda d: d.sections.get("acceptance", {}).get("attempt") == attempt + 1)
                assert isinstance(await client.acceptance(attempt + 1, mine), wire.Ack)
                await _off_loop(lambda: eventually(
                    lambda: c.provision_state(a) == "adopted", "A is adopted with its own 8"))
                await client.report([*mine, {**gpus(1)[0], "index": 8, "uuid": b_gpus[5]}])
                await _off_loop(lambda: eventually(lambda: len(_inventory_events(c, a)) == 2,
                                                   "the report's mismatch is recorded"))
                report = _inventory_events(c, a)[-1]["data"]
                assert report["source"] == "report" and report["claimed"] == [b_gpus[5]]
                capacity = c.gpu_capacity()
                assert capacity["total"] == 16 and capacity["allocated"] == 4
                refused = run([CLI, "nodes", "accept-inventory", a], c.env)
                assert refused.returncode != 0 and b in refused.stderr, refused.stderr
                tg.cancel_scope.cancel()

        anyio.run(main)
        _a_repair_is_taken_when_the_operator_accepts_it(c, b, rsv["gpus"])


async def _refused_and_nothing_moved(c: Cluster, a: str, b: str, rsv: str, before: Any,
                                     source: str) -> None:
    def check() -> None:
        events = _inventory_events(c, a)
        assert [e["data"]["source"] for e in events] == [source]
        data = events[0]["data"]
        assert len(data["claimed"]) == 8 and len(data["added"]) == 16  # made up
        assert data["duplicated"] == [gpus(1, serial="SN-4242")[0]["uuid"]]
        assert c.provision_state(a) == "adopting"
        conditions = {x["type"]: x for x in c.cli_json("nodes", "get", a, "--query",
                                                       "conditions")}
        assert conditions["InventoryMatches"]["status"] == "False"
        assert conditions["InventoryMatches"]["reason"] == "InventoryMismatch"
        capacity, holds, reservation = before
        assert c.gpu_capacity() == {**capacity, "total": 16, "provisioning": 8}
        assert _holds(c, b) == holds
        assert c.cli_json("reservations", "get", rsv) == reservation
        claims = [e for e in _log(c, "gpu.*") if e["data"].get("nodeId") == a]
        assert claims == []

    await _off_loop(check)


def _a_repair_is_taken_when_the_operator_accepts_it(c: Cluster, b: str, held: list[str]
                                                    ) -> None:
    fleet = json.loads(c.machine.gpu_file.read_text())
    spare = next(i for i, g in enumerate(fleet["gpus"]) if g["uuid"] not in held)
    old = fleet["gpus"][spare]["uuid"]
    fleet["gpus"][spare]["uuid"] = "GPU-11111111-2222-3333-4444-555555555555"
    c.machine.gpu_file.write_text(json.dumps(fleet))
    eventually(lambda: any(e["data"]["source"] == "report" for e in _inventory_events(c, b)),
               "the new GPU is refused and recorded")
    mismatch = _inventory_events(c, b)[-1]["data"]
    assert (mismatch["added"], mismatch["missing"]) == (
        ["GPU-11111111-2222-3333-4444-555555555555"], [old])
    assert old in [g["uuid"] for g in c.cli_json("nodes", "get", b, "--query", "gpus")]
    accepted = c.cli_json("nodes", "accept-inventory", b, "--reason", "GPU 3 replaced")
    uuids = [g["uuid"] for g in accepted["gpus"]]
    assert "GPU-11111111-2222-3333-4444-555555555555" in uuids and old not in uuids
    conditions = {x["type"]: x["status"] for x in accepted["conditions"]}
    assert conditions["InventoryMatches"] == "True"
    # Capacity follows: the new GPU is bookable; the old one is nobody's any more.
    rsv = c.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h")
    assert rsv["nodeId"] == b and "GPU-11111111-2222-3333-4444-555555555555" in rsv["gpus"]
    released = [e["data"] for e in _log(c, "gpu.released")]
    assert [(d["uuid"], d["nodeId"]) for d in released] == [(old, b)]
