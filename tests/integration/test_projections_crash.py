"""The projection crash test: kill -9 a process catching up the listings, many times.

Each child applies the listings projection to a backlog and SIGKILLs itself
at a random point (batches of 100): in the middle of a batch (after writing a read-model row,
before the batch's tracking position commits) or right after a batch
committed. After every kill the read model must be exactly the listings of
the events up to its tracking position; at the end it must equal a rebuild
from sequence 0.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

from better_compute.api.runtime import Runtime
from better_compute.domain.base import TenantOwned
from better_compute.domain.token import ApiToken, token_hash
from tests.forking import forker
from tests.support import open_runtime, quick_init
from tests.watching import write_sites

CHILD = r"""
import os, signal, sys
from better_compute.api.runtime import Runtime
from better_compute.projections.framework import ReadModels
from better_compute.projections.listings import Listings

mode, n = sys.argv[1], int(sys.argv[2])
count = 0
if mode == "apply":
    original = Listings.apply
    def apply(self, *args):
        global count
        original(self, *args)
        count += 1
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)
    Listings.apply = apply
else:
    original_batch = ReadModels._apply_batch
    def apply_batch(self, *args):
        global count
        applied = original_batch(self, *args)
        count += 1
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)
        return applied
    ReadModels._apply_batch = apply_batch
runtime = Runtime.open()
runtime.projections.batch_size = 100
runtime.projections.catch_up("listings")
print("caught up", flush=True)
"""
# What every child imports: the forker imports it once, before forking them.
PRELOAD = ("better_compute.api.runtime", "better_compute.projections.framework",
           "better_compute.projections.listings")


def _backlog(runtime: Runtime) -> None:
    """Creates and updates: sites, and tokens of which every other one is revoked."""
    write_sites(runtime, 900, per_save=30)
    tokens = [ApiToken(tenant_id="root", role="member", name=f"t{i}",
                       secret_hash=token_hash(f"secret-{i}"), created_by=None) for i in range(300)]
    for i in range(0, len(tokens), 30):
        runtime.store.save(*tokens[i:i + 30], actor="local")
    for token in tokens[::2]:
        token.revoke(datetime.now(UTC), None)
    for i in range(0, 150, 30):
        runtime.store.save(*tokens[::2][i:i + 30], actor="local")


def _rows(runtime: Runtime) -> dict[str, tuple[Any, ...]]:
    sql = runtime.projections.sql
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, "SELECT uuid, kind, id, tenant_id, audience, created_seq, version, doc "
                            "FROM bc_listing")
        return {r["uuid"]: (r["kind"], r["id"], r["tenant_id"], r["audience"],
                            int(r["created_seq"]), int(r["version"]), json.loads(r["doc"]))
                for r in cursor.fetchall()}


def _position(runtime: Runtime) -> int:
    return runtime.projections.position(runtime.projections.get("listings"))


def _expected_shape(runtime: Runtime, position: int) -> dict[str, tuple[int, int]]:
    """From the log itself: each listed aggregate's creation sequence and version at ``position``."""
    shape: dict[str, tuple[int, int]] = {}
    for n in runtime.store.recorder.select_notifications(start=1, limit=100_000, stop=position):
        if n.topic == "pki.created":
            continue
        uuid = str(n.originator_id)
        created = shape[uuid][0] if uuid in shape else n.id
        shape[uuid] = (created, n.originator_version)
    return shape


def _check(runtime: Runtime, rng: random.Random) -> int:
    position = _position(runtime)
    rows = _rows(runtime)
    expected = _expected_shape(runtime, position)
    assert {u: (r[4], r[5]) for u, r in rows.items()} == expected, f"at position {position}"
    for uuid in rng.sample(sorted(rows), min(15, len(rows))):  # documents, from the aggregates
        row = rows[uuid]
        aggregate: TenantOwned = runtime.store.repository.get(runtime_uuid(uuid), version=row[5])
        assert row[6] == aggregate.to_doc()
    return position


def runtime_uuid(text: str) -> Any:
    from uuid import UUID

    return UUID(text)


def test_killed_catch_ups_leave_a_read_model_equal_to_a_rebuild(env: dict[str, str]) -> None:
    rng = random.Random(20251129)
    runtime = open_runtime(env)
    try:
        quick_init(runtime)
        runtime.projections.rebuild("listings")  # listings exist; the backlog comes after
        _backlog(runtime)
        head = runtime.projections.source.head()
        positions = [_position(runtime)]
        kills = 0
        with forker(env, *PRELOAD) as children:  # each child a process of its own, forked
            while positions[-1] < head and kills < 20:
                mode = rng.choice(["apply", "apply", "batch"])
                n = rng.randint(1, 250) if mode == "apply" else rng.randint(1, 2)
                child, = children.run(CHILD, [mode, str(n)])
                if child.returncode == 0:
                    assert "caught up" in child.stdout
                else:
                    assert child.returncode == -9, child.stderr
                    kills += 1
                positions.append(_check(runtime, rng))
        assert kills >= 8, f"only {kills} kills: the backlog is too small to test anything"
        assert positions == sorted(positions)  # progress is never lost
        runtime.projections.catch_up("listings")
        caught_up = _rows(runtime)
        assert _position(runtime) == head and len(caught_up) == 1 + 1 + 900 + 300
        runtime.projections.rebuild("listings")
        assert _rows(runtime) == caught_up
    finally:
        runtime.close()
