"""Two `serve` replicas on one store: kill -9 the one running controllers, the other takes over.

On PostgreSQL both replicas share one schema (the leader holds an advisory lock on a
connection of its own); on SQLite both serve one data dir (the leader holds an flock on
controllers.lock). The first replica is the only one running when a node joins and is
adopted, so it leads. Then the second starts, the first is killed with SIGKILL, and the
survivor must take over within seconds: a node that joins through it afterwards is
adopted, and the node left talking to the dead replica is marked unreachable. Real
processes throughout (`serve`, the CLI over HTTPS, `bcd join`, `bcd node`); every wait
is on a condition with a deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Machine, Operator
from tests.support import client_env, eventually, free_port, initialize, serve

# Fast timers so the test is short; leadership retries at the default (every second).
FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}
TAKEOVER_WITHIN = 20.0  # seconds from the kill to the new node's adoption, all included


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[Machine]]:
    made = [Machine(tmp_path / "SN-7701", "SN-7701"), Machine(tmp_path / "SN-7702", "SN-7702")]
    try:
        yield made
    finally:
        for machine in made:
            machine.stop()


def test_the_surviving_replica_takes_over_the_controllers(
        env: dict[str, str], tmp_path: Path, machines: list[Machine]) -> None:
    token = initialize(env)
    env = {**env, **FAST}
    first_machine, second_machine = machines
    with serve(env, "--gateway-listen", f"127.0.0.1:{free_port()}") as first:
        operator = Operator(client_env(env, first, token))
        pool = operator.create_pool(tmp_path)
        # Only the first replica runs: its controllers adopt the first node.
        node1 = first_machine.join(operator, first, pool)
        first_machine.start_agent()
        eventually(lambda: operator.provision_state(node1) == "adopted",
                   "the first replica adopts node 1")

        with serve(env, "--gateway-listen", f"127.0.0.1:{free_port()}") as second:
            survivor = Operator(client_env(env, second, token))
            assert survivor.provision_state(node1) == "adopted"  # one store behind both replicas
            first.kill()  # SIGKILL: no clean shutdown, the lock goes with the process
            killed = time.monotonic()

            node2 = second_machine.join(survivor, second, pool)
            assert survivor.provision_state(node2) == "adopting"
            second_machine.start_agent()
            eventually(lambda: survivor.provision_state(node2) == "adopted",
                       "the surviving replica's controllers adopt node 2",
                       timeout=TAKEOVER_WITHIN)
            took = time.monotonic() - killed
            assert took < TAKEOVER_WITHIN
            assert survivor.events(node2) == ["node.joined", "node.connected",
                                              "node.acceptance.started", "node.adopted"]
            # Node 1 still talks to the dead replica's gateway: silent, so the new leader
            # marks it unreachable (the dead replica recorded no disconnect).
            eventually(lambda: "node.unreachable" in survivor.events(node1),
                       "the new leader marks node 1 unreachable")
            assert survivor.events(node1)[-1] == "node.unreachable"
            capacity = survivor.cli_json("capacity", "--pool", pool)
            assert isinstance(capacity, dict)
            gpu = capacity["resources"]["gpu"]
            assert (gpu["allocatable"], gpu["unreachable"]) == (8, 8)
