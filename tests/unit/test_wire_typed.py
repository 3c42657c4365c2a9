"""Typed wire values keep the wire as it was: Report's inventory, telemetry and section states,
and the journal entries, are Structs with the same JSON as the builtins sent before.

An older bcd (builtins) and a newer server (Structs) must still talk, and the other way round:
the bytes are the same, and unknown fields from a newer peer are ignored.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from better_compute.api.wire import gateway as wire
from better_compute.api.wire.inventory import Gpu, HostFacts, Inventory, Telemetry
from better_compute.api.wire.journal import (
    AcceptanceResult,
    AllocationBound,
    Entry,
    EntryInvalid,
    decode_entry,
)

INVENTORY = Inventory(
    host=HostFacts(serial="S1", cpus=64, memory_gib=512.0),
    gpus=[Gpu(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", memory_mib=81559,
              utilization_pct=90 + i, power_w=600.5, healthy=i != 1,
              health_reasons=["xid-79"] if i == 1 else []) for i in range(2)],
    source="fake", driver_version="575.51.03")


def _as_sent_before(inventory: Inventory, time: str) -> dict[str, Any]:
    """The Report as bcd built it from builtins before the values were typed."""
    return {"type": "report", "epoch": 2, "appliedGeneration": 1, "observedGeneration": 1,
            "sections": {"acceptance": {"state": "passed", "message": "ok", "generation": 1,
                                        "attempt": 1, "since": time}},
            "inventory": msgspec.to_builtins(inventory),
            "telemetry": {"time": time, "gpus": [
                {"uuid": g.uuid, "utilizationPct": g.utilization_pct,
                 "temperatureC": g.temperature_c, "powerW": g.power_w,
                 "memoryUsedMiB": g.memory_used_mib, "memoryMiB": g.memory_mib,
                 "healthy": g.healthy} for g in inventory.gpus]}}


def test_a_typed_report_is_the_same_json_as_the_builtins_one() -> None:
    time = "2030-01-01T00:00:00.000Z"
    report = wire.Report(
        epoch=2, applied_generation=1, observed_generation=1,
        sections={"acceptance": wire.SectionState(state="passed", message="ok", generation=1,
                                                  attempt=1, since=time)},
        inventory=INVENTORY, telemetry=Telemetry.of(INVENTORY, time))
    assert json.loads(wire.encode(report)) == _as_sent_before(INVENTORY, time)
    decoded = wire.decode_to_gateway(json.dumps(_as_sent_before(INVENTORY, time)).encode())
    assert decoded == report
    assert isinstance(decoded, wire.Report) and decoded.telemetry is not None
    assert decoded.telemetry.gpus[0].utilization_pct == 90  # an int stays an int
    assert decoded.telemetry.gpus[0].power_w == 600.5


def test_a_newer_bcds_fields_are_ignored_and_an_older_ones_missing_ones_default() -> None:
    doc = _as_sent_before(INVENTORY, "t")
    doc["inventory"]["gpus"][0]["futureField"] = {"x": 1}
    doc["telemetry"]["gpus"][0]["fanPct"] = 40
    doc["sections"]["acceptance"]["extra"] = "x"
    del doc["inventory"]["gpus"][1]["numaNode"], doc["inventory"]["driverVersion"]
    report = wire.decode_to_gateway(json.dumps(doc).encode())
    assert isinstance(report, wire.Report) and report.inventory is not None
    assert report.inventory.gpus[1].numa_node is None and report.inventory.driver_version is None
    assert [g.is_healthy for g in report.inventory.gpus] == [True, False]
    old = wire.decode_to_gateway(wire.encode(wire.Report(epoch=1, applied_generation=0,
                                                         observed_generation=0)))
    assert isinstance(old, wire.Report) and old.inventory is None and old.telemetry is None


def test_journal_entries_decode_once_by_kind_and_name_a_misfit() -> None:
    doc = {"kind": "allocation.bound", "nodeId": "node_x", "epoch": 3, "time": "t",
           "allocationId": "alloc_a", "gpus": ["GPU-0"], "cdiDevices": ["bcd.dev/gpu=GPU-0"],
           "envFile": "/run/bcd/a.env", "cgroupParent": "bcd-alloc-a.slice",
           "cdiSpec": "/etc/cdi/a.json", "fromANewerBcd": True}
    head = decode_entry(doc, Entry)
    assert (head.kind, head.node_id, head.epoch) == ("allocation.bound", "node_x", 3)
    bound = decode_entry(doc, AllocationBound)
    assert (bound.allocation_id, bound.cdi_devices) == ("alloc_a", ["bcd.dev/gpu=GPU-0"])
    assert msgspec.to_builtins(bound) == {k: v for k, v in doc.items() if k != "fromANewerBcd"}
    with pytest.raises(EntryInvalid, match=r"acceptance.result.*\$\.attempt"):
        decode_entry({"kind": "acceptance.result", "attempt": "one"}, AcceptanceResult)
    with pytest.raises(EntryInvalid, match="kind"):
        decode_entry({"nodeId": "node_x"}, Entry)
    result = decode_entry({"kind": "acceptance.result", "attempt": 2, "passed": True,
                           "checks": [{"kind": "diag.nvml", "passed": True, "message": "8"}],
                           "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100",
                                     "anything": 1}]}, AcceptanceResult)
    assert result.checks[0].passed and [g.uuid for g in result.gpus] == ["GPU-0"]
    # Bounded (api/wire/bounds.py): 65 GPUs, or a name of 257 characters, refuse the entry.
    with pytest.raises(EntryInvalid, match=r"\$\.gpus"):
        decode_entry({"kind": "acceptance.result", "attempt": 2, "gpus": [
            {"index": i, "uuid": f"GPU-{i}", "name": "x"} for i in range(65)]},
            AcceptanceResult)
    with pytest.raises(EntryInvalid, match=r"\$\.gpus\[0\]\.name"):
        decode_entry({"kind": "acceptance.result", "attempt": 2, "gpus": [
            {"index": 0, "uuid": "GPU-0", "name": "x" * 257}]}, AcceptanceResult)
