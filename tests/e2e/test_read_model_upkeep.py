"""A server at rest has every read model at the head of the log, without a read.

A real ``serve`` takes creates and releases over HTTPS; then nobody reads. Within moments
every read model, the listings and the usage included, has applied every event (each
process's follower, projections/framework.py ``Follower``; the free-GPU index is applied by
every save): the next ``list`` or ``usage.report`` waits for at most a batch's events, not
for everything since the last read. The positions are read from the store by another
process's runtime, which catches nothing up.
"""

from __future__ import annotations

from pathlib import Path

from tests.fleet import add_nodes, make_pool
from tests.outage import api_client, rpc_call
from tests.support import eventually, initialize, open_runtime, serve


def _lags(env: dict[str, str]) -> dict[str, int]:
    runtime = open_runtime(env)
    try:
        return {each.name: each.lag for each in runtime.projections.status()}
    finally:
        runtime.close()


def test_every_read_model_reaches_the_head_without_a_read(env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    try:
        pool = make_pool(runtime.service)
        add_nodes(runtime.service, pool, 2)
        runtime.projections.catch_up()
    finally:
        runtime.close()
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env) as server, api_client(server.url, ca) as http:
        made = []
        for n in range(6):
            out = rpc_call(http, token, "reservations.create",
                           {"poolId": pool, "gpus": 1, "duration": "1h", "key": f"k{n}"})
            assert out.error is None, out
            made.append(out.result["id"])
        for rsv in made[:3]:
            assert rpc_call(http, token, "reservations.release", {"reservationId": rsv}).error is None
        lags = _lags(env)
        assert set(lags) == {"listings", "capacity", "free_gpus", "reservations", "usage"}, lags
        # The tokens pass scans the listings only every 30 s, and nothing else reads the
        # usage: without a follower both stay behind for longer than this wait.
        eventually(lambda: not any(_lags(env).values()),
                   "every read model applies every event without a read", timeout=10.0)
