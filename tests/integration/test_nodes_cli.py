"""nodes list/get/events/cordon/uncordon and capacity, in-process, on each backend."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import UUID

import msgspec

from better_compute.api.wire.journal import AcceptanceResult
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.ids import parse_id
from tests.gateway_client import gpus, make_plane
from tests.support import cli_inprocess


def _json(env: dict[str, str], *argv: str) -> Any:  # the parsed JSON
    code, out, err = cli_inprocess([*argv, "--output", "json"], env)
    assert code == 0, err
    return json.loads(out)


def test_nodes_commands_and_maintenance_in_capacity(env: dict[str, str], tmp_path: Path) -> None:
    plane = make_plane(env, tmp_path)
    try:
        node = plane.join().node_id
        listed = _json(env, "nodes", "list", "--pool", plane.pool)
        assert [n["id"] for n in listed] == [node]
        code, out, _ = cli_inprocess(["nodes", "get", node, "--query", "provisionState"], env)
        assert (code, out) == (0, "adopting\n")
        conditions = _json(env, "nodes", "get", node, "--query", "conditions")
        assert [c["type"] for c in conditions] == [
            "Connected", "AcceptancePassed", "Healthy", "Schedulable", "InventoryMatches"]
        assert [e["type"] for e in _json(env, "nodes", "events", node)] == [
            "node.joined"]

        # Adopt it as the gateway would, then put it in maintenance and back.
        plane.nodes.session_opened(_uuid(node), "0.1.0", actor=node)
        plane.lifecycle.reconcile()
        plane.runtime.services.inventory.acceptance_result(_uuid(node), 1, msgspec.convert({
            "kind": "acceptance.result", "attempt": 1, "passed": True, "gpus": gpus(8),
            "checks": [{"kind": "diag.nvml", "passed": True}]}, AcceptanceResult))
        capacity = _json(env, "capacity", "--pool", plane.pool)
        assert capacity["resources"]["gpu"]["allocatable"] == 8
        cordoned = _json(env, "nodes", "cordon", node, "--reason", "firmware update")
        assert cordoned["maintenance"]["cordoned"] is True
        gpu = _json(env, "capacity", "--pool", plane.pool)["resources"]["gpu"]
        assert (gpu["maintenance"], gpu["allocatable"]) == (8, 0)
        _json(env, "nodes", "uncordon", node)
        gpu = _json(env, "capacity", "--pool", plane.pool)["resources"]["gpu"]
        assert (gpu["maintenance"], gpu["allocatable"]) == (0, 8)
        types = [e["type"] for e in plane.nodes.events(LOCAL_OPERATOR, node)]
        assert types[-2:] == ["node.cordoned", "node.uncordoned"]
    finally:
        plane.runtime.close()


def test_bad_node_input_changes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    plane = make_plane(env, tmp_path)
    try:
        node = plane.join().node_id
        code, _, err = cli_inprocess(["nodes", "list", "--pool", "pool_nope"], env)
        assert code != 0 and "is not a pool id" in err
        code, _, err = cli_inprocess(["nodes", "get", "node_" + "a" * 26], env)
        assert code != 0 and "no node" in err
        code, _, err = cli_inprocess(["api", "nodes.adopt", f"nodeId={node}", "bogus=1"], env)
        assert code != 0 and "bogus" in err
        code, _, err = cli_inprocess(["capacity"], env)
        assert code != 0 and "--pool" in err
        # A running attempt cannot be restarted; an adopted node cannot be adopted again.
        plane.nodes.adopt(LOCAL_OPERATOR, "root", node, "first try")
        code, _, err = cli_inprocess(["api", "nodes.adopt", "tenantId=root", f"nodeId={node}",
                                      "reason=again"], env)
        assert code != 0 and "still running" in err
        assert [e["type"] for e in plane.nodes.events(LOCAL_OPERATOR, node)] == [
            "node.joined", "node.acceptance.started"]
    finally:
        plane.runtime.close()


def _uuid(node_id: str) -> UUID:
    return parse_id("node", node_id)
