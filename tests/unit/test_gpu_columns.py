"""The free-GPU index's JSON columns, parsed once per distinct text (projections/gpu_columns.py)."""

from __future__ import annotations

import json

import pytest

from better_compute.projections.gpu_columns import parsed_booking_gpus, parsed_node_gpus


def _column(healthy: list[bool]) -> str:
    return json.dumps([{"uuid": f"GPU-{i}", "index": i, "attributes": {"healthy": h, "model": "H100"}}
                       for i, h in enumerate(healthy)])


def test_a_node_column_is_parsed_once_and_shared_read_only() -> None:
    text = _column([True, False, True])
    first = parsed_node_gpus(text)
    assert first.count == 3
    assert first.healthy_uuids == ["GPU-0", "GPU-2"]
    assert [g.index for g in first.healthy] == [0, 2]
    assert parsed_node_gpus(str(text.encode().decode())) is first  # an equal text: the same value
    with pytest.raises(TypeError):
        first.healthy[0].attributes["healthy"] = False  # type: ignore[index]


def test_a_changed_column_is_a_new_value() -> None:
    before = parsed_node_gpus(_column([True, True]))
    after = parsed_node_gpus(_column([True, False]))
    assert before.healthy_uuids == ["GPU-0", "GPU-1"]
    assert after.healthy_uuids == ["GPU-0"]


def test_a_booking_column_is_a_frozen_set() -> None:
    held = parsed_booking_gpus('["GPU-a", "GPU-b"]')
    assert held == frozenset({"GPU-a", "GPU-b"})
    assert parsed_booking_gpus('["GPU-a", "GPU-b"]') is held
