"""`nodes get` shows the node's newest report: generations, sections, GPU telemetry.

Reports are frequent, so they are kept beside the events (``bc_node_report``), written
by the gateway with the heartbeats, never as events. The gateway runs in-process with a
client that speaks the wire, on each backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from better_compute.api.store.node_presence import Reports
from better_compute.api.wire import gateway as wire
from better_compute.domain.ids import parse_id
from tests.gateway_client import (
    NodeClient,
    Plane,
    gpus,
    run_with_gateway,
    wait_for,
)
from tests.support import cli_inprocess


def telemetry(count: int) -> dict[str, object]:
    return {"time": "2030-01-01T00:00:00.000Z", "gpus": [
        {"uuid": g["uuid"], "utilizationPct": 90 + i, "temperatureC": 60, "powerW": 600.5,
         "memoryUsedMiB": 1000 * i, "memoryMiB": 81559, "healthy": g["healthy"]}
        for i, g in enumerate(gpus(count, healthy=count - 1))]}


def test_the_newest_report_is_kept_and_shown_by_nodes_get(env: dict[str, str],
                                                          tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        assert plane.gateway is not None
        gateway = plane.gateway
        node = plane.join()
        assert plane.node(node.node_id)["report"] is None  # never reported
        client = NodeClient(plane, node)
        await client.connect()

        async def send(applied: int, observed: int, message: str) -> None:
            seen = gateway.stats["reports"]
            # Raw JSON documents in place of the typed structs (SectionState, Inventory,
            # Telemetry), encoded as they are: an unknown field ("extra") included.
            await client.send(wire.Report(
                epoch=client.epoch, applied_generation=applied, observed_generation=observed,
                sections={"acceptance": {"state": "passed", "message": message,  # type: ignore[dict-item]
                                         "generation": 0, "attempt": 1,
                                         "since": "2030-01-01T00:00:00.000Z", "extra": "x"}},
                inventory={"gpus": gpus(8, healthy=7), "host": {}, "source": "fake"},  # type: ignore[arg-type]
                telemetry=telemetry(8)))  # type: ignore[arg-type]
            await wait_for(lambda: gateway.stats["reports"] > seen)
            await gateway.flush_heartbeats()

        await send(0, 1, "attempt 1: 8 healthy H100 GPUs")
        report = plane.node(node.node_id)["report"]
        assert (report["epoch"], report["appliedGeneration"], report["observedGeneration"]) == \
            (1, 0, 1)
        assert report["at"] is not None
        assert report["sections"] == {"acceptance": {
            "state": "passed", "message": "attempt 1: 8 healthy H100 GPUs", "generation": 0,
            "attempt": 1, "since": "2030-01-01T00:00:00.000Z"}}
        assert len(report["gpus"]) == 8
        first, sick = report["gpus"][0], report["gpus"][7]
        assert first == {"uuid": gpus(8)[0]["uuid"], "healthy": True, "healthReasons": [],
                         "utilizationPct": 90, "temperatureC": 60, "powerW": 600.5,
                         "memoryUsedMiB": 0, "memoryMiB": 81559}
        assert (sick["healthy"], sick["healthReasons"]) == (False, ["xid-79"])
        assert report["telemetryTime"] == "2030-01-01T00:00:00.000Z"

        plane.clock.advance(5)
        await send(1, 1, "applied")
        newer = plane.node(node.node_id)["report"]
        assert (newer["appliedGeneration"], newer["sections"]["acceptance"]["message"]) == \
            (1, "applied")
        assert newer["at"] > report["at"]
        # Kept beside the events, never as one.
        assert plane.event_types(node.node_id)[:2] == ["node.joined", "node.connected"]
        assert not any("report" in t for t in plane.event_types(node.node_id))

        # The operator's view, as the tutorial's commands print it.
        code, out, err = await anyio.to_thread.run_sync(lambda: cli_inprocess(
            ["nodes", "get", node.node_id, "--query", "report", "--output", "json"],
            plane.runtime.env))
        assert code == 0, err
        shown = json.loads(out)
        assert shown["appliedGeneration"] == 1 and shown["gpus"][0]["utilizationPct"] == 90
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_a_report_of_an_older_session_never_replaces_a_newer_one(env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        rows = Reports(plane.runtime.service.sql)
        uuid = str(parse_id("node", node.node_id))
        now = plane.clock.now
        rows.record([(uuid, 2, now, {"epoch": 2, "appliedGeneration": 5})])
        rows.record([(uuid, 1, now, {"epoch": 1, "appliedGeneration": 1})])  # late, older
        assert plane.node(node.node_id)["report"] == {"epoch": 2, "appliedGeneration": 5}
        rows.record([(uuid, 3, now, {"epoch": 3, "appliedGeneration": 6})])
        assert plane.node(node.node_id)["report"]["epoch"] == 3

    run_with_gateway(env, tmp_path, body)
