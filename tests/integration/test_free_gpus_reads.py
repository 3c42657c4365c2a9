"""A create's events are applied to the free-GPU index reading the node's row once.

A create records the booking (and, when it starts now, the node's device assignment): the
index needs the node's pool for the booking and its GPUs at the end of the batch, and read
the same row twice per create, a round trip each on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.fleet import offered_pool
from tests.integration.test_follow_own_saves import _rebuilt
from tests.integration.test_read_model_wants import _rows


def test_a_create_reads_its_node_s_index_row_once(runtime: Any, env: dict[str, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pool = offered_pool(runtime.service, nodes=2, gpus=16)
    rs = runtime.services.reservations
    rs.create(OP, tenant_id="acme", pool_id=pool, gpus=1, duration="1h")
    runtime.projections.catch_up()
    sql = runtime.projections.sql
    reads: list[str] = []
    real = type(sql).execute

    def execute(self: Any, cursor: Any, statement: str, params: Any = ()) -> None:
        if "FROM bc_fg_node WHERE node_id" in statement:
            reads.append(statement)
        real(self, cursor, statement, params)

    doc = rs.create(OP, tenant_id="acme", pool_id=pool, gpus=2, duration="1h")
    monkeypatch.setattr(type(sql), "execute", execute)
    runtime.projections.follow("free_gpus")  # applies the create: booked, node assigned
    assert len(reads) == 1, reads
    monkeypatch.undo()
    rs.release(OP, doc["id"])
    runtime.projections.follow("free_gpus")
    assert _rows(runtime, "free_gpus") == _rebuilt(env, "free_gpus")
