"""The spine, end to end with real processes: reserve, bind on the node, use, release.

A real `better-compute serve --gateway-listen`, `bcd join` and `bcd node` under
BCD_ROOT with the fake GPU source, and `better-compute events watch` as a real
process. The CDI device names `reservations get` returns are exactly the GPU
UUIDs the store booked, the node's CDI spec lists exactly those GPUs (and is a
valid CDI document), `capacity` shows them allocated and available goes back up
after release, and the events arrive in order. Every wait is on a condition
with a deadline; the controller tick is shortened through the environment.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from better_compute.domain.bookings import NodeBookings, bookings_uuid
from tests.cdi_support import check_cdi_spec
from tests.cluster import Cluster, adopted_cluster
from tests.support import cli_inprocess, eventually, open_runtime
from tests.watching import CliWatcher

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    """The tutorial up to an adopted 8-GPU node whose bcd is running (epoch 1)."""
    with adopted_cluster(env, tmp_path, FAST) as c:
        yield c


def test_reserve_bind_use_release(cluster: Cluster) -> None:
    c = cluster
    watch = CliWatcher(c.env, "--types", "node.*,reservation.*", "--since", "0")
    try:
        preview = c.cli_json("capacity", "--preview", "--pool", c.pool, "--gpus", "4",
                             "--for", "2h")
        assert preview["fits"] is True and preview["nodeId"] == c.node

        code, out, err = cli_inprocess(["reserve", "--pool", c.pool, "--gpus", "4",
                                        "--for", "2h"], c.env)
        assert code == 0, err
        assert "idempotency key" in err
        placed = json.loads(out)
        rsv, alloc = placed["id"], placed["allocationId"]
        # reserve waits (--wait, default 20 s) until bcd bound the hold: it answers `active`.
        assert placed["state"] == "active" and placed["binding"]["nodeId"] == c.node
        binding = c.cli_json("reservations", "get", rsv, "--query", "binding")
        assert binding["nodeId"] == c.node
        assert binding["cgroupParent"] == f"bcd-alloc-{alloc}.slice"
        assert binding["envFile"].endswith(f"/run/bcd/allocations/{alloc}.env")

        # Exactly the GPUs the store booked, read from the store itself.
        rt = open_runtime(c.store_env)
        try:
            node_bookings: NodeBookings = rt.store.repository.get(bookings_uuid(c.node))
            booked = node_bookings.bookings[alloc]["gpus"]
        finally:
            rt.close()
        assert sorted(binding["cdiDevices"]) == sorted(f"bcd.dev/gpu={g}" for g in booked)
        spec = json.loads(c.spec_path(alloc).read_text())
        check_cdi_spec(spec)
        assert sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"]) == \
            sorted(binding["cdiDevices"])
        env_file = c.machine.root / "run" / "bcd" / "allocations" / f"{alloc}.env"
        assert f"BCD_CGROUP_PARENT=bcd-alloc-{alloc}.slice" in env_file.read_text()

        gpu = c.gpu_capacity()
        assert (gpu["allocated"], gpu["available"]) == (4, 4)

        assert c.cli("release", rsv, "--query", "state") == "released"
        # bcd removes the spec, then the env file: two steps, so both are awaited.
        eventually(lambda: not c.spec_path(alloc).exists() and not env_file.exists(),
                   "bcd removed the hold's CDI spec and env file")
        eventually(lambda: c.gpu_capacity()["available"] == 8, "available goes back up")
        types = [e["type"] for e in watch.until("reservation.released")
                 if e["type"].startswith("reservation.")]
        assert types == ["reservation.placed", "reservation.binding", "reservation.active",
                         "reservation.released"]
    finally:
        watch.stop(signal.SIGKILL)


def test_a_release_while_bcd_is_away_completes_when_it_returns(cluster: Cluster) -> None:
    c = cluster
    rsv = c.cli("reserve", "--pool", c.pool, "--gpus", "8", "--for", "1h", "--key", "away",
                "--query", "id")
    eventually(lambda: c.state(rsv) == "active", "the reservation is active")
    alloc = c.cli("reservations", "get", rsv, "--query", "allocationId")
    agent = c.machine.agents[0]
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=30)
    assert c.spec_path(alloc).exists()  # bcd never drops a hold on its own

    assert c.cli("release", rsv, "--query", "state") == "released"
    assert c.spec_path(alloc).exists()  # nobody on the node to act yet
    c.start_agent(epoch=2)
    eventually(lambda: not c.spec_path(alloc).exists(),
               "the returning bcd removes the released hold")
    assert c.gpu_capacity()["allocated"] == 0

