"""The tutorial from `bcd join` through `capacity --pool`, with real processes.

A real `better-compute serve --gateway-listen` on loopback, the CLI as an
operator types it, `bcd join` and `bcd node` as real processes under
BCD_ROOT with the fake GPU source. Timers are shortened through the
environment (heartbeat 1 s, unreachable after 3 s) so waiting for the
unreachable mark is short; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, running_cluster
from tests.support import eventually

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(env, tmp_path, FAST) as c:
        yield c


def test_join_adopt_status_capacity_kill_and_reconnect(cluster: Cluster) -> None:
    c = cluster
    node = c.join()
    assert [n["id"] for n in c.cli_json("nodes", "list", "--pool", c.pool)] == [node]
    agent = c.start_agent(epoch=1)

    eventually(lambda: c.cli("nodes", "get", node, "--query", "provisionState") == "adopted",
               "the node is adopted")
    assert c.events(node) == ["node.joined", "node.connected", "node.acceptance.started",
                              "node.adopted"]
    conditions = {x["type"]: x for x in c.cli_json("nodes", "get", node, "--query",
                                                   "conditions")}
    assert all(x["status"] == "True" for x in conditions.values()), conditions
    assert conditions["Connected"]["message"] == "connected (epoch 1)"

    eventually(lambda: json.loads(c.bcd("status", "--json").stdout or "{}")
               .get("spec", {}).get("appliedGeneration") == 1, "bcd applied generation 1")
    status = json.loads(c.bcd("status", "--json").stdout)
    assert len(status["gpus"]) == 8 and status["session"]["epoch"] == 1
    text = c.bcd("status").stdout
    assert "connected (epoch 1)" in text

    capacity = c.gpu_capacity()
    assert (capacity["total"], capacity["allocatable"], capacity["available"]) == (8, 8, 8)

    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=30)
    eventually(lambda: "node.unreachable" in c.events(node), "the node is marked unreachable")
    capacity = c.gpu_capacity()
    assert (capacity["unreachable"], capacity["allocatable"]) == (8, 0)

    c.start_agent(epoch=2)
    eventually(lambda: c.gpu_capacity()["allocatable"] == 8, "the node counts again")
    assert c.events(node)[-3:] == ["node.disconnected", "node.unreachable", "node.connected"]
    session = c.cli_json("nodes", "get", node, "--query", "session")
    assert (session["state"], session["epoch"]) == ("connected", 2)


def test_seven_healthy_gpus_stay_adopting_until_fixed_and_adopted(cluster: Cluster) -> None:
    c = cluster
    gpu_file = c.machine.gpu_file
    fleet = json.loads(gpu_file.read_text())
    fleet["gpus"][3]["healthy"] = False
    gpu_file.write_text(json.dumps(fleet))
    node = c.join()
    c.start_agent(epoch=1)
    eventually(lambda: "node.acceptance.failed" in c.events(node), "acceptance fails")
    assert c.cli("nodes", "get", node, "--query", "provisionState") == "adopting"
    assert c.gpu_capacity()["provisioning"] == 8

    fleet["gpus"][3]["healthy"] = True
    gpu_file.write_text(json.dumps(fleet))
    adopted = c.cli_json("api", "nodes.adopt", "tenantId=root", f"nodeId={node}",
                         "reason=GPU 3 reseated")
    assert adopted["acceptance"]["attempt"] == 2
    eventually(lambda: c.cli("nodes", "get", node, "--query", "provisionState") == "adopted",
               "the second attempt adopts the node")
    assert c.events(node) == ["node.joined", "node.connected", "node.acceptance.started",
                              "node.acceptance.failed", "node.acceptance.started", "node.adopted"]
    assert c.gpu_capacity()["allocatable"] == 8
