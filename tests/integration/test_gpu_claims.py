"""A GPU UUID belongs to at most one node in the whole store (domain/gpu_claims.py), however a
node came by it: the control plane in this process, its real gateway, nodes that speak the
session protocol (tests/gateway_client.py), on SQLite and PostgreSQL.

A machine that joined listing another machine's GPUs (its join facts are its own word) is
refused at acceptance once the other one holds them; two adoptions that race for one GPU
leave it with one of them, because the claim is saved in the adopting save and the store
refuses the second; removing a node frees its GPUs for another.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from better_compute.api.services import inventory
from better_compute.api.services.reservation_journal import entry_of
from better_compute.api.store.verify import verify
from better_compute.api.wire import gateway as wire
from better_compute.api.wire.journal import AcceptanceResult
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.gpu_claims import GpuClaim, gpu_claim_uuid
from better_compute.domain.ids import parse_id
from tests.gateway_client import NodeClient, Plane, gpus, run_with_gateway
from tests.join_client import hardware


def test_a_gpu_of_another_node_is_refused_until_that_node_lets_it_go(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(plane: Plane) -> None:
        owner = plane.join(serial="SN-7701")
        twin_facts = hardware(serial="SN-7702", gpus=8)
        twin_facts.gpus = hardware(serial="SN-7701", gpus=8).gpus  # the owner's GPUs
        twin = plane.join(facts=twin_facts)
        first, second = NodeClient(plane, owner), NodeClient(plane, twin)
        await first.connect()
        await second.connect()
        await plane.reconcile()  # attempt 1 for both
        await first.receive_desired(lambda d: "acceptance" in d.sections)
        await second.receive_desired(lambda d: "acceptance" in d.sections)

        # The twin's result comes while it still sees the GPUs free (a race): its claims
        # are created in its save, which the store refuses; the retry finds them taken. The
        # owner's verdict is saved meanwhile in the same thread, as another replica's gateway
        # would (this gateway writes its sessions' changes one batch at a time).
        real = inventory.claims_of
        stale: list[bool] = []
        verdict = entry_of(AcceptanceResult, {
            "kind": "acceptance.result", "nodeId": owner.node_id, "epoch": 1,
            "time": "2030-01-01T00:00:00Z", "attempt": 1, "passed": True, "gpus": gpus(8),
            "checks": [{"kind": "diag.nvml", "passed": True, "message": "8 healthy GPUs"}]})

        def racing(aggregates: Any, uuids: Any) -> Any:
            found = real(aggregates, uuids)
            if not stale:  # the twin's first look: before the owner's save
                stale.append(True)
                assert plane.runtime.services.inventory.acceptance_result(
                    parse_id("node", owner.node_id), 1, verdict) is None
                return dict.fromkeys(found)
            return found

        monkeypatch.setattr(inventory, "claims_of", racing)
        answer = await second.acceptance(1, gpus(8))
        monkeypatch.setattr(inventory, "claims_of", real)
        assert isinstance(answer, wire.Nack) and answer.code == "inventory_mismatch", answer
        assert "8 belong to another node" in answer.message
        assert plane.node(owner.node_id)["provisionState"] == "adopted"
        twin_doc = plane.node(twin.node_id)
        assert twin_doc["provisionState"] == "adopting"
        assert twin_doc["acceptance"]["failureReason"] == "inventory"
        assert len(twin_doc["inventoryMismatch"]["claimed"]) == 8
        capacity = plane.capacity()
        assert (capacity["allocatable"], capacity["provisioning"]) == (8, 8)

        # The owner leaves the pool: its GPUs are nobody's, and the twin may have them.
        await anyio.to_thread.run_sync(lambda: plane.nodes.remove(
            LOCAL_OPERATOR, owner.node_id, "card moved", False))
        await anyio.to_thread.run_sync(lambda: plane.nodes.adopt(
            LOCAL_OPERATOR, "root", twin.node_id, "its owner was removed"))
        await second.receive_desired(
            lambda d: d.sections.get("acceptance", {}).get("attempt") == 2)
        assert isinstance(await second.acceptance(2, gpus(8)), wire.Ack)
        assert plane.node(twin.node_id)["provisionState"] == "adopted"
        assert plane.capacity()["allocatable"] == 8
        await first.close()
        await second.close()

    run_with_gateway(env, tmp_path, body)


def test_store_verify_checks_that_each_gpu_belongs_to_one_node(
        env: dict[str, str], tmp_path: Path) -> None:
    """``store verify`` holds the rule against the log itself: an adopted node's GPUs claimed
    by it, no claim held by a node that does not list the GPU. The faults are written past the
    services (as a bug would) and each is reported."""


    async def body(plane: Plane) -> None:
        owner = plane.join(serial="SN-7701")
        node = NodeClient(plane, owner)
        await node.connect()
        await plane.reconcile()
        await node.receive_desired(lambda d: "acceptance" in d.sections)
        assert isinstance(await node.acceptance(1, gpus(8)), wire.Ack)
        await node.close()
        report = verify(plane.runtime)
        assert report["ok"], report["problems"]
        assert report["gpus"] == 8

        store, at = plane.runtime.store, datetime.now(UTC)
        uuids = [g["uuid"] for g in plane.node(owner.node_id)["gpus"]]
        taken: GpuClaim = store.repository.get(gpu_claim_uuid(uuids[0]))
        assert taken.release(owner.node_id, at, "a bug")  # its node still lists it
        stray = GpuClaim(tenant_id="root", uuid="GPU-not-on-any-node")
        stray.claim(owner.node_id, "root", at)  # held by a node that does not list it
        store.save(taken, stray, actor="local")

        problems = verify(plane.runtime)["problems"]
        assert any(f"GPU {uuids[0]} of adopted node {owner.node_id} is not claimed" in p
                   for p in problems), problems
        assert any("GPU GPU-not-on-any-node is claimed by node" in p for p in problems), problems

    run_with_gateway(env, tmp_path, body)
