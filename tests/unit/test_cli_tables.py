"""Tables a person reads: curated columns that fit a 120-column terminal with full ids."""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml

from better_compute.cli import event_lines
from better_compute.cli.output import emit
from better_compute.cli.tables import CAPACITY, EVENTS, NODES, RESERVATIONS, span
from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id

WIDTH = 120


class Terminal(io.StringIO):
    """A terminal of WIDTH columns: every line must fit without wrapping."""

    def isatty(self) -> bool:
        return True


def iso(delta: timedelta) -> str:
    """A time from now (now when called: the tables read the clock when they render)."""
    return (datetime.now(UTC) + delta).isoformat().replace("+00:00", "Z")


def ident(prefix: str) -> str:
    return public_id(prefix, uuid.uuid4())


POOL = ident("pool")


def node(i: int, **extra: Any) -> dict[str, Any]:
    gpus = [{"uuid": f"GPU-{i}-{g}", "healthy": g != 3 or i != 1} for g in range(8)]
    return {"id": ident("node"), "tenantId": "root", "poolId": POOL, "siteId": ident("site"),
            "provisionState": "adopted", "acceptance": {"state": "passed"},
            "maintenance": {"cordoned": i == 2}, "gpus": gpus, "heldGpus": 4 * (i == 0),
            "session": {"state": "disconnected" if i == 1 else "connected", "epoch": 3,
                        "lastSeen": iso(timedelta(seconds=-2))},
            "joinedAt": iso(timedelta(hours=-26)), "bcdVersion": "0.1.0", **extra}


NODE_DOCS = [node(i) for i in range(3)]
RSV_IDS = [ident("rsv") for _ in range(3)]


def reservation_docs() -> list[dict[str, Any]]:
    # Times half a minute off the minute: the seconds the test itself takes do not matter.
    plans = [("active", 4, -330, 6930), ("placed", 8, 7230, 14430), ("cancelled", 2, 1830, 9030)]
    return [{"id": RSV_IDS[i], "tenantId": "acme", "poolId": POOL, "state": state,
             "gpuCount": n, "nodeId": NODE_DOCS[i]["id"], "allocationId": f"alloc_{i}",
             "key": f"k{i}", "start": iso(timedelta(seconds=start)),
             "end": iso(timedelta(seconds=end)), "endedAt": None}
            for i, (state, n, start, end) in enumerate(plans)]


RESERVATION_DOCS = reservation_docs()
CAPACITY_DOC = {
    "poolId": POOL, "gpuModel": "H100",
    "resources": {
        "gpu": {"total": 24, "allocatable": 8, "allocated": 4, "reserved": 8, "available": 0,
                "provisioning": 0, "unhealthy": 1, "maintenance": 8, "unreachable": 7},
        "cpu": {"total": 672, "allocatable": 224, "allocated": 112, "reserved": 0,
                "available": 112},
        "memory": {"total": 6046.68, "allocatable": 2015.56, "allocated": 1000, "reserved": 0,
                   "available": 1015.56, "unit": "GiB"},
    },
    "nodes": {"total": 3, "adopting": 0, "adopted": 3, "connected": 2, "unreachable": 0},
}


def table(value: Any, spec: Any, output: str | None = None) -> str:
    out = Terminal()
    emit(value, out=out, table=spec, output=output)
    return out.getvalue()


@pytest.mark.parametrize("value,spec,ids", [
    (NODE_DOCS, NODES, [d["id"] for d in NODE_DOCS] + [POOL]),
    (RESERVATION_DOCS, RESERVATIONS,
     [d["id"] for d in RESERVATION_DOCS] + [d["nodeId"] for d in RESERVATION_DOCS]),
    (CAPACITY_DOC, CAPACITY, []),
], ids=["nodes list", "reservations list", "capacity"])
def test_three_nodes_fit_a_120_column_terminal_with_full_ids(value: Any, spec: Any,
                                                             ids: list[str]) -> None:
    text = table(value, spec)
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), "\n".join(lines)
    for full in ids:
        assert full in text  # never cut: ids are what people copy
    assert "{" not in text and "True" not in text  # no JSON blobs, no Python spellings
    rows = lines[1:]
    # One line per object (per resource for capacity, which adds a line of node counts).
    assert len([r for r in rows if not r.startswith("nodes:")]) == 3


def test_node_rows_say_state_gpus_held_session_and_age() -> None:
    header, first, second, third = table(NODE_DOCS, NODES).splitlines()
    assert header.split() == ["ID", "POOL", "STATE", "GPUS", "HELD", "SESSION", "AGE"]
    assert first.split()[2:] == ["adopted", "8/8", "4", "connected", "1d2h"]
    assert second.split()[2:4] == ["adopted", "7/8"] and "disconnected" in second
    assert third.split()[2] == "adopted,cordoned"


def test_reservations_show_the_pool_only_when_it_varies_and_times_from_now() -> None:
    text = table(reservation_docs(), RESERVATIONS)
    header = text.splitlines()[0].split()
    assert header == ["ID", "GPUS", "STATE", "NODE", "START", "END"]  # one pool: no POOL
    assert "5m ago" in text and "in 1h55m" in text and "in 2h" in text
    other = {**RESERVATION_DOCS[0], "poolId": ident("pool")}
    assert "POOL" in table([*RESERVATION_DOCS, other], RESERVATIONS).splitlines()[0]
    wide = table(RESERVATION_DOCS, RESERVATIONS, "wide")
    assert wide.splitlines()[0].split()[:2] == ["ID", "POOL"] and "ALLOCATION" in wide


def test_capacity_is_one_row_per_resource_with_the_counts() -> None:
    lines = table(CAPACITY_DOC, CAPACITY).splitlines()
    assert lines[0].split() == ["RESOURCE", "TOTAL", "ALLOCATABLE", "ALLOCATED", "RESERVED",
                                "AVAILABLE", "PROVISIONING", "UNHEALTHY", "MAINTENANCE",
                                "UNREACHABLE"]
    assert lines[1].split() == ["gpu", "24", "8", "4", "8", "0", "0", "1", "8", "7"]
    assert lines[3].split()[:3] == ["memory", "(GiB)", "6046.7"]
    assert lines[4] == "nodes: 3 total, 0 adopting, 3 adopted, 2 connected, 0 unreachable"


def test_other_formats_json_yaml_and_name() -> None:
    assert json.loads(table(NODE_DOCS, NODES, "json")) == NODE_DOCS
    assert yaml.safe_load(table(NODE_DOCS, NODES, "yaml")) == NODE_DOCS
    assert table(NODE_DOCS, NODES, "name").splitlines() == [d["id"] for d in NODE_DOCS]
    assert table(NODE_DOCS[0], NODES, "name") == NODE_DOCS[0]["id"] + "\n"
    with pytest.raises(InvalidInput, match="-o name prints ids"):
        table(CAPACITY_DOC, CAPACITY, "name")


def test_a_query_reshapes_the_answer_into_the_generic_table() -> None:
    out = Terminal()
    emit(NODE_DOCS, out=out, table=NODES, query="[].{id: id, state: provisionState}")
    assert out.getvalue().splitlines()[0].split() == ["ID", "STATE"]


def test_node_events_table_and_the_watch_line() -> None:
    event = {"sequence": 42, "type": "reservation.placed", "time": iso(timedelta()),
             "tenantId": "acme", "subject": RESERVATION_DOCS[0]["id"],
             "data": {"gpus": ["GPU-a", "GPU-b", "GPU-c", "GPU-d"], "nodeId": NODE_DOCS[0]["id"],
                      "poolId": POOL}}
    line = event_lines.line(event)
    assert "#42  reservation.placed" in line and RESERVATION_DOCS[0]["id"] in line
    assert line.endswith(f"4 GPUs on {NODE_DOCS[0]['id']}") and len(line) <= WIDTH + 10
    assert "\x1b[32m" in event_lines.line(event, colour=True)  # placed: green
    assert "\x1b[31m" in event_lines.line({**event, "type": "reservation.failed"}, colour=True)
    long = {**event, "type": "node.reported", "data": {"x": "y" * 300}}
    assert len(event_lines.summary(long)) == event_lines.SUMMARY_WIDTH
    text = table([event], EVENTS)
    assert text.splitlines()[0].split() == ["SEQUENCE", "TIME", "TYPE", "SUMMARY"]


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (125, "2m"), (3600 + 300, "1h5m"),
                                          (11 * 3600, "11h"), (26 * 3600, "1d2h"),
                                          (12 * 86400, "12d")])
def test_spans_read_like_kubectl_ages(seconds: int, text: str) -> None:
    assert span(seconds) == text


def test_detail_views_nest_fields_like_kubectl_describe_and_never_print_json() -> None:
    rsv = {"id": RSV_IDS[0], "state": "active", "gpuCount": 4,
           "request": {"gpus": 4, "for": "2h", "selector": None, "nvlink": False},
           "binding": {"nodeId": NODE_DOCS[0]["id"],
                       "cdiDevices": [f"bcd.dev/gpu=GPU-0-{g}" for g in range(4)],
                       "envFile": "/run/bcd/allocations/alloc_0.env"},
           "hostResources": {"cpus": 104, "memoryGiB": 956}, "labels": []}
    out = Terminal()
    emit(rsv, out=out)
    text = out.getvalue()
    assert not set(text) & set('{}[]"'), text  # no JSON anywhere
    assert f"id:            {RSV_IDS[0]}\n" in text
    assert "request:\n  gpus:     4\n  for:      2h\n  selector: <none>\n  nvlink:   false\n" \
        in text
    assert "binding:\n  nodeId:" in text and "  cdiDevices:\n    - bcd.dev/gpu=GPU-0-0\n" in text
    assert "hostResources:\n  cpus:      104\n  memoryGiB: 956\n" in text
    assert "labels:        <none>\n" in text
    node = Terminal()
    emit(NODE_DOCS[1], out=node)
    gpus = node.getvalue().split("gpus:\n", 1)[1].splitlines()
    assert gpus[0].split() == ["UUID", "HEALTHY"] and gpus[4].split() == ["GPU-1-3", "false"]
    preview = {"fits": False, "reason": "held", "earliest": {
        "start": "2026-12-03T14:00:00Z", "nodeId": NODE_DOCS[0]["id"],
        "hostResources": {"cpus": 52, "memoryGiB": 478}}}
    shown = Terminal()
    emit(preview, out=shown)
    assert shown.getvalue().endswith(
        "earliest:\n  start:         2026-12-03T14:00:00Z\n"
        f"  nodeId:        {NODE_DOCS[0]['id']}\n"
        "  hostResources:\n    cpus:      52\n    memoryGiB: 478\n")
    assert "{" not in shown.getvalue()
