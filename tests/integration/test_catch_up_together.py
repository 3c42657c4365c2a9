"""Read models in step are caught up together (projections/framework.py, ``_catch_up_together``).

Once this process has seen several read models at the same position, catching one of them up
reads and decodes the new events once and applies them to all of them in one transaction. A
read model that cannot apply an event still holds back only itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.projections.listings import Listings
from tests.fleet import add_nodes, make_pool


def _positions(runtime: Any) -> dict[str, int]:
    rm = runtime.projections
    return {name: rm.position(p) for name, p in rm.projections.items()}


def _in_step(runtime: Any) -> int:
    runtime.projections.catch_up()
    head = runtime.projections.source.head()
    assert set(_positions(runtime).values()) == {head}
    return head


def test_one_catch_up_brings_every_read_model_in_step_along(runtime: Any) -> None:
    _in_step(runtime)
    transactions = []
    original = runtime.projections.sql.transaction

    def counting(*, commit: bool) -> Any:
        transactions.append(commit)
        return original(commit=commit)

    runtime.projections.sql.transaction = counting
    try:
        pool = make_pool(runtime.service)
        add_nodes(runtime.service, pool, 2)
        head = runtime.projections.source.head()
        transactions.clear()
        runtime.projections.catch_up("free_gpus")
    finally:
        del runtime.projections.sql.transaction
    assert set(_positions(runtime).values()) == {head}  # all of them, not free_gpus alone
    assert transactions.count(True) == 1  # one write transaction for all of them


def test_a_read_model_that_cannot_apply_an_event_holds_back_only_itself(
        runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    before = _in_step(runtime)

    def broken(self: Any, *args: Any) -> None:
        raise RuntimeError("a bug in the listings")

    monkeypatch.setattr(Listings, "apply", broken)
    make_pool(runtime.service)
    head = runtime.projections.source.head()
    runtime.projections.catch_up("free_gpus")  # the shared batch fails: free_gpus goes alone
    assert _positions(runtime)["free_gpus"] == head
    for name in runtime.projections.projections:
        if name != "listings":
            runtime.projections.catch_up(name)
    with pytest.raises(RuntimeError, match="a bug in the listings"):
        runtime.projections.catch_up("listings")
    positions = _positions(runtime)
    assert positions.pop("listings") == before
    assert set(positions.values()) == {head}

    monkeypatch.undo()
    runtime.projections.catch_up("listings")
    assert set(_positions(runtime).values()) == {head}
    assert any(p["id"] for p in runtime.service.listing("pool"))
