"""Drain, remove and re-join with real processes: `serve`, the CLI, `bcd join`, `bcd node`.

A drained node keeps its hold and takes no new one; removing it is refused
while it holds anything; --force releases the hold, then removes the node;
the node's bcd is told so, says why and exits 3; the machine joins again
and gets its old node back. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import _PINS, Cluster, adopted_cluster
from tests.support import cli_inprocess, eventually, wait_for_line

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    with adopted_cluster(env, tmp_path, FAST) as c:
        yield c


def _join_again(c: Cluster) -> str:
    """A fresh join token for the same machine, and `bcd join` with the pins."""
    folder = c.machine.folder
    c.cli("join-tokens", "create", "--pool", c.pool, "--ttl", "2h", "--max-uses", "1",
          "--expect-serial", c.machine.serial, "--key", "join-again",
          "--out", str(folder / "join-token-2"))
    pins: list[str] = []
    for name, flag in _PINS:
        pins += [flag, c.cli("pki", "show", "--query", name)]
    done = c.bcd("join", "--server", c.server.url + "/api/compute", *pins,
                 "--token-file", "./join-token-2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"node {c.node} was removed from the control plane: joining again"
    return lines[-1].split()[2]  # "joined as node_… (site …"


def test_drain_remove_force_and_rejoin(cluster: Cluster) -> None:
    c = cluster
    agent = c.machine.agents[-1]
    held = c.cli_json("reserve", "--pool", c.pool, "--gpus", "4", "--for", "2h")
    eventually(lambda: c.state(held["id"]) == "active", "the reservation is active")
    assert c.spec_path(held["allocationId"]).exists()

    # Drain: the hold stays, nothing new is placed.
    drained = c.cli_json("nodes", "drain", c.node, "--reason", "replace PSU")
    assert drained["maintenance"]["state"] == "draining"
    code, _, err = cli_inprocess(["reserve", "--pool", c.pool, "--gpus", "1", "--for", "1h"],
                                 c.env)
    assert code == 8 and err.startswith("error [no_capacity]:") and f"pool {c.pool}" in err, err
    assert "cordoned or draining" in err, err
    assert c.state(held["id"]) == "active" and c.spec_path(held["allocationId"]).exists()
    assert c.cli("nodes", "get", c.node, "--query", "maintenance.state") == "draining"

    # Remove: refused while it holds the reservation; --force releases it first.
    code, _, err = cli_inprocess(["nodes", "remove", c.node], c.env)
    assert code == 6 and held["id"] in err and "--force" in err, err
    assert c.provision_state(c.node) == "adopted"
    removed = c.cli_json("nodes", "remove", c.node, "--force", "--reason", "retired")
    assert removed["provisionState"] == "removed"
    assert removed["removal"]["releasedReservations"] == [held["id"]]
    assert c.state(held["id"]) == "released"
    types = [e["type"] for e in c.cli_json("nodes", "events", c.node)]
    assert types[-1] == "node.removed" and "node.devices.unassigned" in types

    # bcd is told, says why, and stops with exit status 3 (its unit does not restart it).
    wait_for_line(agent, "the control plane removed this node")
    assert agent.wait(timeout=60) == 3
    gpu = c.gpu_capacity()
    assert (gpu["total"], gpu["allocatable"]) == (0, 0)
    assert c.cli_json("capacity", "--pool", c.pool)["nodes"]["total"] == 0

    # The same machine joins again: the same node comes back, adopting, then adopted.
    assert _join_again(c) == c.node
    assert [n["id"] for n in c.cli_json("nodes", "list", "--pool", c.pool)] == [c.node]
    c.start_agent(epoch=2)
    eventually(lambda: c.provision_state(c.node) == "adopted", "the node is adopted again")
    eventually(lambda: c.gpu_capacity()["allocatable"] == 8, "it counts again")
    # The released hold is gone: bcd converges on its desired state after the session opens.
    eventually(lambda: not c.spec_path(held["allocationId"]).exists(), "the old hold is gone")
    types = [e["type"] for e in c.cli_json("nodes", "events", c.node)]
    assert types[types.index("node.removed"):][:2] == ["node.removed", "node.rejoined"]
    assert types[-1] == "node.adopted"

    # Who did each: the operator's token, the node, the controllers, the join token.
    me = c.cli("api", "system.whoami", "--query", "tokenId")
    actors = {(e["type"], e["actor"]) for e in c.cli_json("nodes", "events", c.node)}
    assert {("node.draining", me), ("node.removed", me), ("node.connected", c.node),
            ("node.adopted", c.node), ("node.acceptance.started", "controller:nodes")} <= actors
    rejoined = [a for t, a in actors if t == "node.rejoined"]
    assert len(rejoined) == 1 and rejoined[0].startswith("jt_")
    lines = c.cli("events", "list", "--subject", held["id"]).splitlines()
    by_type = {e["type"]: e["actor"] for e in map(json.loads, lines)}
    # It started at once, so its create's own save recorded its binding (docs/events.md).
    assert by_type == {"reservation.placed": me, "reservation.binding": me,
                       "reservation.active": c.node, "reservation.released": me}
    mine = [json.loads(x) for x in c.cli("events", "list", "--actor", me, "--from", "now-1h")
            .splitlines()]
    assert mine and {e["actor"] for e in mine} == {me}
