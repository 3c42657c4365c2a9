"""The node aggregate across its modules (domain/node.py, node_acceptance.py, node_retirement.py).

Its commands and events live in three modules; the events stay the aggregate's own: the
same public topics and the same data as the ones already stored, and a node rebuilt from
its stored events (through the store's codec) equals the node that recorded them.
"""

from __future__ import annotations

import pickle
from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.domain import CanMutateAggregate

from better_compute.api.store.actor import stamp
from better_compute.api.store.codec import EventMapper, MsgspecTranscoder
from better_compute.domain.ids import new_uuid
from better_compute.domain.node import NODE_ROLE, Node

AT = datetime(2026, 11, 29, 22, 38, 0, 34368, tzinfo=UTC)
GPUS = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H100 80GB HBM3", "healthy": True,
         "healthReasons": []} for i in range(2)]

# Every node event as stored before the split: topic -> the fields of its data.
STORED = {
    "node.acceptance.failed": ("at", "attempt", "message", "reason", "results"),
    "node.acceptance.started": ("at", "attempt", "checks", "generation", "reason",
                                "requested_by"),
    "node.adopted": ("at", "attempt", "generation", "gpus", "results"),
    "node.certificate.renewed": ("at", "not_after", "serial"),
    "node.connected": ("at", "bcd_version", "epoch"),
    "node.cordoned": ("at", "by", "reason"),
    "node.devices.assigned": ("assignment", "at", "generation"),
    "node.devices.unassigned": ("allocation_id", "at", "generation"),
    "node.disconnected": ("at", "epoch", "reason"),
    "node.drained": ("at",),
    "node.draining": ("at", "by", "held", "reason"),
    "node.gpu.healthy": ("at", "uuid"),
    "node.gpu.unhealthy": ("at", "reasons", "uuid"),
    "node.inventory.accepted": ("at", "by", "gpus", "previous", "reason"),
    "node.inventory.mismatch": ("accepted", "added", "at", "changed", "claimed", "duplicated",
                                "message", "missing", "reported", "reported_count", "source"),
    "node.joined": ("bcd_version", "certificate_not_after", "certificate_serial", "gpus",
                    "hardware", "hardware_key", "join_token_id", "key_pin", "pool_id", "role",
                    "site_id", "tenant_id"),
    "node.rejoined": ("at", "bcd_version", "certificate_not_after", "certificate_serial", "gpus",
                      "hardware", "join_token_id", "key_pin", "pool_id", "site_id"),
    "node.removed": ("at", "by", "certificate_serial", "reason", "released"),
    "node.uncordoned": ("at", "by"),
    "node.unreachable": ("at", "epoch", "last_seen"),
}


def _joined() -> Node:
    return Node(id=new_uuid(), tenant_id="root", pool_id="pool_x", site_id="site_x",
                join_token_id="jt_x", role=NODE_ROLE, hardware_key="serial:x",
                hardware={"cpus": 64, "memoryGiB": 512}, gpus=GPUS, key_pin="sha256/x",
                certificate_serial="1", certificate_not_after=AT + timedelta(days=7),
                bcd_version="1.0")


def _state(node: Node) -> dict[str, Any]:
    return {k: v for k, v in vars(node).items() if k != "_pending_events"}


def test_every_node_event_keeps_its_topic_and_its_data() -> None:
    # TOPIC: each event class has one (the domain's TenantOwned.Event declares it), but the
    # library's CanMutateAggregate, which picks them out here, does not.
    events = {cls.TOPIC: tuple(sorted(cls.__annotations__))  # type: ignore[attr-defined]
              for cls in vars(Node).values()
              if isinstance(cls, type) and issubclass(cls, CanMutateAggregate)
              and cls.TOPIC.startswith("node.")}  # type: ignore[attr-defined]
    assert events == STORED


def test_a_node_rebuilt_from_its_stored_events_equals_the_one_that_recorded_them() -> None:
    node = _joined()
    node.connect(AT, "1.1")
    attempt = node.start_acceptance(AT, [{"kind": "diag.nvml"}], "joined", None)
    assert node.finish_acceptance(attempt, False, "1 healthy", [{"kind": "diag.nvml"}], None, AT)
    attempt = node.start_acceptance(AT, [{"kind": "diag.nvml"}], "again", "tok_x")
    assert node.finish_acceptance(attempt, True, "", [], GPUS, AT)
    assert node.set_gpu_health("GPU-1", False, ["xid-79"], AT)
    assert node.assign_devices({"allocationId": "alloc_a", "gpus": ["GPU-0"]}, AT)
    assert node.drain("retire", AT, "root", held=1) and node.maintenance_state == "draining"
    assert node.unassign_devices("alloc_a", AT) and node.mark_drained(AT)
    node.remove(AT, "root", "retired", released=[])
    assert node.removed and node.removal is not None
    node.rejoin(pool_id="pool_y", site_id="site_x", join_token_id="jt_y", hardware={},
                gpus=GPUS, key_pin="sha256/y", certificate_serial="2",
                certificate_not_after=AT, bcd_version="1.2", at=AT)
    assert node.provision_state == "adopting" and node.generation == 3
    mapper = EventMapper(MsgspecTranscoder())
    rebuilt: Any = None
    events = node.collect_events()
    stamp(events, "local")  # who did it: every stored event has one
    for event in events:
        rebuilt = mapper.to_domain_event(mapper.to_stored_event(event)).mutate(rebuilt)
    assert _state(rebuilt) == _state(node)
    assert rebuilt.to_doc() == node.to_doc()


def test_a_node_kept_by_the_aggregate_cache_comes_back_equal_and_independent() -> None:
    """The store's aggregate cache keeps a node as an object (``COPY_ON_WRITE``: its events
    give attributes new values) and hands out a shallow copy at each load, which its events
    never change under another copy; changing a shared value in place is caught."""
    import pytest

    from better_compute.api.store import aggregate_cache
    from better_compute.api.store.aggregate_cache import AggregateCache, ChangedInPlace

    assert aggregate_cache.CHECK_IN_PLACE  # tests/conftest.py
    node = _joined()
    node.connect(AT, "1.1")
    node.cordon("maintenance", AT, "tok_x")
    node.assign_devices({"allocationId": "alloc_a", "gpus": ["GPU-0"]}, AT)
    node.collect_events()  # saved
    cache = AggregateCache()
    cache.put(node)
    assert not isinstance(cache._entries[node.id][1], bytes)  # kept, not pickled

    class Repository:  # nothing stored after the cached version
        class event_store:
            @staticmethod
            def get(**kwargs: Any) -> list[Any]:
                assert kwargs == {"originator_id": node.id, "gt": node.version}
                return []

    twin = cache.load(node.id, Repository)
    assert twin is not node and type(twin) is Node
    assert _state(twin) == _state(node)
    before = pickle.dumps(_state(node))
    twin.uncordon(AT, "tok_x")
    twin.set_gpu_health("GPU-1", False, ["xid-79"], AT)
    twin.assign_devices({"allocationId": "alloc_b", "gpus": ["GPU-1"]}, AT)
    twin.unassign_devices("alloc_a", AT)
    twin.drain("retire", AT, "root", held=1)
    twin.start_acceptance(AT, [{"kind": "diag.nvml"}], "again", "tok_x")
    assert twin.maintenance_state == "draining" and node.maintenance_state == "cordoned"
    assert pickle.dumps(_state(node)) == before  # the events changed nothing it shares
    again = cache.load(node.id, Repository)
    assert again.cordoned is True and not again.pending_events
    assert list(again.devices) == ["alloc_a"] and again.gpu_values()[1].healthy
    again.hardware["cpus"] = 1  # in place: every copy shares ``hardware``
    with pytest.raises(ChangedInPlace, match="changed in place"):
        cache.load(node.id, Repository)


def test_the_aggregate_cache_keeps_the_newest_version_and_at_most_its_size() -> None:
    from better_compute.api.store.aggregate_cache import AggregateCache

    cache = AggregateCache(size=2)
    node = _joined()
    node.collect_events()
    cache.put(node)
    old = _state(node)["_version"]
    node.connect(AT, "1.1")
    node.collect_events()
    cache.put(node)
    stale = _joined()  # another object with the same id at an older version
    object.__setattr__(stale, "_id", node.id)
    cache.put(stale)
    assert cache._entries[node.id][0] == node.version > old
    for _ in range(3):
        other = _joined()
        other.collect_events()
        cache.put(other)
    assert len(cache) == 2 and node.id not in cache._entries
