"""Workers of one server pack their own partitions of nodes, so they do not collide.

Two runtimes on one store stand for two workers of ``serve --workers 2``; every create of
the second has one of the first commit between its choice and its save, as happens when
both place at once: without partitions, both choose the fullest node of the pool and the same
GPU, and the second loses and places again; with a partition each, neither places again. Either
way no GPU is booked twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.placement import NodePartition
from tests.fleet import add_nodes, make_pool, placed_again
from tests.support import quick_init


@pytest.mark.parametrize("partitions", [True, False])
def test_two_workers_with_partitions_never_place_again(env: dict[str, str], partitions: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    first = Runtime.open(dict(env), partition=NodePartition(0, 2) if partitions else None)
    quick_init(first)
    second = Runtime.open(dict(env), partition=NodePartition(1, 2) if partitions else None)
    try:
        pool = make_pool(first.service)
        nodes = add_nodes(first.service, pool, 6)
        while min(sum(NodePartition(i, 2).holds(n) for n in nodes) for i in (0, 1)) < 2:
            nodes += add_nodes(first.service, pool, 1)  # ids are random: 12 GPUs a partition
        lost = placed_again(monkeypatch)
        placed: dict[str, list[dict[str, Any]]] = {"first": [], "second": []}

        def create(runtime: Runtime) -> dict[str, Any]:
            return runtime.services.reservations.create(OP, tenant_id=None, pool_id=pool,
                                                        gpus=1, duration="1h")

        core = second.services.reservations.core
        choose = core.choose

        def meanwhile(*args: Any) -> Any:  # the first worker commits while the second saves
            chosen = choose(*args)
            if len(placed["first"]) < 12:
                placed["first"].append(create(first))
            return chosen

        monkeypatch.setattr(core, "choose", meanwhile)
        for _ in range(12):
            placed["second"].append(create(second))
        docs = placed["first"] + placed["second"]
        held = [(doc["nodeId"], gpu) for doc in docs for gpu in doc["gpus"]]
        assert len(held) == len(set(held)) == 24  # no GPU booked twice
        used = {name: {d["nodeId"] for d in each} for name, each in placed.items()}
        if partitions:
            assert lost == []
            assert used["first"].isdisjoint(used["second"])
            assert all(NodePartition(0, 2).holds(n) for n in used["first"])
        else:
            assert len(lost) >= 6  # the same fullest node and GPU, chosen by both
    finally:
        second.close()
        first.close()
