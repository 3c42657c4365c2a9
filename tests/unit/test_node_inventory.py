"""What a node may change of its GPUs (domain/node_inventory.py) and the claim that keeps a GPU
to one node (domain/gpu_claims.py), on plain values and aggregates."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from better_compute.benchmarks.fleet import build_node, gpu_docs
from better_compute.domain.errors import Conflict
from better_compute.domain.gpu_claims import GpuClaim, gpu_claim_uuid
from better_compute.domain.node_inventory import compare_inventory, with_reported_health

AT = datetime(2030, 1, 1, tzinfo=UTC)
MINE = gpu_docs(8, "a")
THEIRS = gpu_docs(8, "b")


def test_the_gpus_it_has_match_in_any_order_and_health_is_not_a_change() -> None:
    sick = [{**g, "healthy": False, "healthReasons": ["xid-79"]} for g in reversed(MINE)]
    assert compare_inventory(MINE, sick).matches


def test_forty_gpus_for_eight_name_each_kind_of_difference() -> None:
    listed = [*MINE, *THEIRS, *[MINE[0]] * 8,
              *[{**g, "uuid": f"GPU-made-up-{i}"} for i, g in enumerate(gpu_docs(16, "x"))]]
    diff = compare_inventory(MINE, listed, claimed={g["uuid"] for g in THEIRS})
    assert not diff.matches and (diff.accepted, diff.reported) == (8, 40)
    assert diff.claimed == tuple(g["uuid"] for g in THEIRS)
    assert len(diff.added) == 16 and diff.duplicated == (MINE[0]["uuid"],)
    assert diff.missing == () and diff.changed == ()
    message = diff.message()
    assert "listed 40 GPUs where 8 were accepted" in message and "and 3 more" in message
    assert "nodes accept-inventory" in message


def test_a_missing_gpu_and_another_model_are_differences() -> None:
    other = [*MINE[:7], {**MINE[7], "name": "NVIDIA A100-SXM4-80GB", "family": "A100",
                         "product": "A100"}]
    assert compare_inventory(MINE, other).changed == (MINE[7]["uuid"],)
    assert compare_inventory(MINE, MINE[:7]).missing == (MINE[7]["uuid"],)


def test_adopted_gpus_are_the_accepted_ones_with_the_reported_health() -> None:
    reported = [{**g, "healthy": False, "healthReasons": ["xid-79"], "name": "evil"}
                for g in MINE]
    adopted = with_reported_health(MINE, reported)
    assert [g["uuid"] for g in adopted] == [g["uuid"] for g in MINE]
    assert all(g["name"] == MINE[0]["name"] and g["healthReasons"] == ["xid-79"]
               for g in adopted)


def test_a_node_records_a_mismatch_once_and_an_operator_ends_it() -> None:
    node = build_node("pool_x", gpus=8)
    listed = [*node.gpus[:7], {**node.gpus[7], "uuid": "GPU-new"}]
    diff = compare_inventory(node.gpus, listed)
    assert node.note_inventory_mismatch(diff, listed, "report", AT)
    sick = [{**g, "healthy": False} for g in listed]  # the same GPUs, sicker: not news
    assert not node.note_inventory_mismatch(compare_inventory(node.gpus, sick), sick,
                                            "report", AT)
    assert node.statuses()["InventoryMatches"] is False
    condition = {c["type"]: c for c in node.conditions()}["InventoryMatches"]
    assert condition["reason"] == "InventoryMismatch" and "GPU-new" in condition["message"]
    node.accept_inventory(listed, AT, "tok_x", "GPU 7 replaced")
    assert node.inventory_mismatch is None and node.gpus[7]["uuid"] == "GPU-new"
    assert node.statuses()["InventoryMatches"] is True


def test_a_gpu_is_one_nodes_until_released() -> None:
    claim = GpuClaim(tenant_id="root", uuid="GPU-1")
    assert claim.id == gpu_claim_uuid("GPU-1")
    assert claim.claim("node_a", "root", AT) and not claim.claim("node_a", "root", AT)
    assert claim.held_by_another("node_b") == "node_a" and claim.held_by_another("node_a") is None
    with pytest.raises(Conflict, match="belongs to node node_a"):
        claim.claim("node_b", "acme", AT)
    assert not claim.release("node_b", AT, "removed") and claim.release("node_a", AT, "removed")
    assert claim.claim("node_b", "acme", AT) and claim.tenant_id == "acme"
    events = claim.collect_events()
    assert [type(e).TOPIC for e in events] == ["gpu.recorded", "gpu.claimed", "gpu.released",  # type: ignore[attr-defined]
                                               "gpu.claimed"]
    assert events[-1].tenant_id == "acme"  # type: ignore[attr-defined]  # a card moved
