"""The earliest start, moving earlier and the queue, end to end with real processes.

A real `better-compute serve --gateway-listen` (it runs the controllers: the timers and the
queue dispatcher), a real GPU server (`bcd join`, `bcd node`, 8 fake GPUs) and `better-compute
events watch` as a real process. The pool is full until T: the preview answers T exactly,
`--start earliest` books T, an early release moves it forward (seen on `events watch`); a
queued request over quota is placed by the dispatcher once its quota is freed; backfill places a
small request without delaying the head of the queue; cancel and timeout leave nothing
booked and refund nothing twice. Time is the server's own (the controller tick is shortened
through the environment); every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from better_compute.domain.events import event_type
from better_compute.domain.ids import parse_id
from better_compute.domain.quota import quota_uuid
from tests.cluster import Cluster, Operator, running_cluster
from tests.support import CLI, eventually, open_runtime
from tests.watching import CliWatcher

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    """The tutorial up to an adopted 8-GPU node whose bcd runs, and tenant acme (quota 4)."""
    with running_cluster(env, tmp_path, FAST) as c:
        c.join()
        c.start_agent(epoch=1)
        eventually(lambda: c.provision_state(c.node) == "adopted", "the node is adopted")
        c.cli("tenants", "create", "acme")
        c.cli("pools", "offer", c.pool, "--to", "acme", "--quota", "gpu=4")
        yield c


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def store_facts(c: Cluster, rsv: str) -> tuple[list[str], list[str]]:
    """The reservation's own events and the quota events that name it, read from the store."""
    rt = open_runtime(c.store_env)
    try:
        own = [event_type(e) for e in rt.store.events.get(parse_id("rsv", rsv))]
        quota = [event_type(e) for e in rt.store.events.get(quota_uuid(c.pool, "acme"))
                 if getattr(e, "reservation_id", None) == rsv]
    finally:
        rt.close()
    return own, quota


def test_earliest_start_moves_forward_and_the_queue_places_by_itself(cluster: Cluster) -> None:
    c = cluster
    acme = Operator({**c.env, "BETTER_COMPUTE_TENANT": "acme"})
    watch = CliWatcher(c.env, "--types", "reservation.*", "--since", "0")
    try:
        # The pool is full until T.
        full = c.cli_json("reserve", "--pool", c.pool, "--gpus", "8", "--for", "2h",
                          "--key", "full")
        eventually(lambda: c.state(full["id"]) == "active", "the blocking reservation binds")
        preview = c.cli_json("capacity", "--preview", "--pool", c.pool, "--gpus", "8",
                             "--for", "1h")
        assert preview["fits"] is False and preview["earliest"]["start"] == full["end"]
        assert preview["earliest"]["nodeId"] == c.node and len(preview["earliest"]["gpus"]) == 8

        early = c.cli_json("reserve", "--pool", c.pool, "--gpus", "8", "--for", "1h",
                           "--start", "earliest", "--key", "early")
        assert early["state"] == "placed" and early["start"] == full["end"]
        assert early["gpus"] == preview["earliest"]["gpus"]

        # An early release of the blocking reservation moves it forward.
        c.cli("release", full["id"])
        moved = [e for e in watch.until("reservation.rescheduled") if e["subject"] == early["id"]]
        assert moved and moved[-1]["type"] == "reservation.rescheduled"
        data = moved[-1]["data"]
        assert data["previousStart"] == full["end"] and at(data["start"]) < at(full["end"])
        eventually(lambda: c.state(early["id"]) == "active", "the moved reservation binds now")
        early = c.cli_json("reservations", "get", early["id"])

        # A queued request over quota is placed by itself once the quota is freed.
        holder = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h",
                               "--start", "earliest", "--key", "acme-holder")
        assert holder["start"] == early["end"]  # acme's 4 GPUs of quota are all held
        waiting = subprocess.Popen(
            [CLI, "reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h", "--queue",
             "--key", "acme-queued", "--wait", "60", "--output", "json"],
            env=acme.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        eventually(lambda: _queued(acme, "acme-queued"), "the request is queued")
        queued = acme.cli_json("reservations", "list", "--state", "queued")
        assert [(r["queue"]["position"], r["key"]) for r in queued] == [(1, "acme-queued")]
        acme.cli("release", holder["id"], "--cancel")
        events = watch.until("reservation.dequeued")
        freed = next(e for e in events if e["type"] == "reservation.cancelled")
        placed = events[-1]
        assert placed["data"]["nodeId"] == c.node
        assert placed["sequence"] > freed["sequence"] and at(placed["time"]) >= at(freed["time"])
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        dequeued = json.loads(out)  # `reserve --wait` waited for the placement
        assert dequeued["state"] == "placed" and dequeued["start"] == early["end"]

        # Backfill: behind acme's head (over quota until `dequeued` ends), a small request
        # that ends before the head's slot is placed; one that would take it waits.
        head = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h",
                             "--queue", "--key", "acme-head", "--wait", "0")
        assert head["state"] == "queued"
        small = c.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h",
                           "--queue", "--key", "small", "--wait", "0")
        assert small["state"] == "placed" and small["start"] == early["end"]
        large = c.cli_json("reserve", "--pool", c.pool, "--gpus", "6", "--for", "3h",
                           "--queue", "--key", "large", "--wait", "0")
        assert large["state"] == "queued" and large["queue"]["position"] == 2
        acme.cli("release", dequeued["id"], "--cancel")  # acme's quota frees: the head goes
        eventually(lambda: acme.cli("reservations", "get", head["id"], "--query", "state")
                   == "placed", "the head is placed")
        head = acme.cli_json("reservations", "get", head["id"])
        assert at(head["start"]) <= at(dequeued["end"])  # never later than its shadow
        eventually(lambda: c.state(large["id"]) == "placed", "the one behind is placed")

        # Cancel and timeout leave nothing booked and refund nothing twice.
        acme.cli("release", head["id"], "--cancel")
        refill = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h",
                             "--start", "earliest", "--key", "refill")
        assert refill["state"] == "placed"  # acme is at its quota again
        cancelled = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "2", "--for", "1h",
                                  "--queue", "--key", "cancelled", "--wait", "0")
        timing_out = acme.cli_json("reserve", "--pool", c.pool, "--gpus", "2", "--for", "1h",
                                   "--queue", "--queue-timeout", "2s", "--key", "timeout",
                                   "--wait", "0")
        assert acme.cli("release", cancelled["id"], "--cancel", "--query", "state") == \
            "cancelled"
        eventually(lambda: acme.cli("reservations", "get", timing_out["id"], "--query",
                                    "state") == "expired", "the queued reservation expires")
        for rsv in (cancelled["id"], timing_out["id"]):
            own, quota = store_facts(c, rsv)
            assert quota == []
            assert "reservation.dequeued" not in own
        assert store_facts(c, dequeued["id"])[1] == ["quota.taken", "quota.refunded"]
        assert store_facts(c, head["id"])[1] == ["quota.taken", "quota.refunded"]
    finally:
        watch.stop(signal.SIGKILL)


def _queued(acme: Operator, key: str) -> bool:
    found: list[dict[str, Any]] = acme.cli_json("reservations", "list", "--state", "queued")
    return any(r["key"] == key for r in found)
