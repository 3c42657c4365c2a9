"""The tutorial from `bcd join` through `capacity --pool`, with real processes.

A real `better-compute serve --gateway-listen` on loopback, the CLI as an
operator types it, `bcd join` and `bcd node` as real processes under
BCD_ROOT with the fake GPU source. Timers are shortened through the
environment (heartbeat 1 s, unreachable after 3 s) so waiting for the
unreachable mark is short; every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from better_compute.agent.gpu import write_fake_fleet_file
from tests.support import (
    BCD,
    POLICY,
    Server,
    cli_inprocess,
    client_env,
    eventually,
    free_port,
    initialize,
    run,
    serve,
    wait_for_line,
)

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@dataclass
class Cluster:
    server: Server
    operator: dict[str, str]
    node_env: dict[str, str]
    work: Path
    gpu_file: Path
    pool: str
    agents: list[subprocess.Popen[str]]

    def cli(self, *argv: str) -> str:
        code, out, err = cli_inprocess(list(argv), self.operator)
        assert code == 0, err
        return out.strip()

    def cli_json(self, *argv: str) -> Any:
        return json.loads(self.cli(*argv, "--output", "json"))

    def bcd(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run([BCD, *argv], self.node_env, cwd=self.work, input="")

    def join(self) -> str:
        self.cli("join-tokens", "create", "--pool", self.pool, "--ttl", "2h", "--max-uses", "1",
                 "--expect-serial", "SN-7701", "--key", "join-sn-7701", "--out", str(
                     self.work / "join-token"))
        pins: list[str] = []
        for name, flag in (("servingCaSpkiPin", "--serving-ca-pin"),
                           ("joinSigningKeyPin", "--join-signing-pin"),
                           ("joinEncryptionKeyPin", "--join-encryption-pin")):
            pins += [flag, self.cli("pki", "show", "--query", name)]
        done = self.bcd("join", "--server", self.server.url + "/api/compute", *pins,
                        "--token-file", "./join-token")
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[2]  # "joined as node_… (site …"

    def start_agent(self, epoch: int) -> subprocess.Popen[str]:
        agent = subprocess.Popen([BCD, "node", "--config", "/etc/bcd/config.toml"],
                                 env=self.node_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=self.work)
        self.agents.append(agent)
        wait_for_line(agent, f"session connected (epoch {epoch})")
        return agent

    def events(self, node: str) -> list[str]:
        return [e["type"] for e in self.cli_json("nodes", "events", node)]

    def gpu_capacity(self) -> dict[str, int]:
        return self.cli_json("capacity", "--pool", self.pool)["resources"]["gpu"]




@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    token = initialize(env)
    env = {**env, **FAST}
    with serve(env, "--gateway-listen", f"127.0.0.1:{free_port()}") as server:
        operator = client_env(env, server, token)
        work = tmp_path / "work"
        work.mkdir()
        (work / "pool-policy.json").write_text(json.dumps(POLICY))
        site = cli_inprocess(["sites", "create", "--kind", "shared", "--region", "eu-1",
                              "--key", "site-eu-1", "--query", "id"], operator)[1].strip()
        code, pool, err = cli_inprocess(
            ["pools", "create", "--site", site, "--class", "metal-host", "--gpu-model", "H100",
             "--policy-file", str(work / "pool-policy.json"), "--key", "pool-eu-1-h100",
             "--query", "id"], operator)
        assert code == 0, err
        root = tmp_path / "bcd-root"
        root.mkdir()
        gpu_file = tmp_path / "gpus.json"
        write_fake_fleet_file(gpu_file, serial="SN-7701")
        node_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                    "BCD_ROOT": str(root), "BCD_GPU_SOURCE": f"fake:{gpu_file}"}
        c = Cluster(server, operator, node_env, work, gpu_file, pool.strip(), [])
        try:
            yield c
        finally:
            for agent in c.agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait(timeout=30)


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
    fleet = json.loads(c.gpu_file.read_text())
    fleet["gpus"][3]["healthy"] = False
    c.gpu_file.write_text(json.dumps(fleet))
    node = c.join()
    c.start_agent(epoch=1)
    eventually(lambda: "node.acceptance.failed" in c.events(node), "acceptance fails")
    assert c.cli("nodes", "get", node, "--query", "provisionState") == "adopting"
    assert c.gpu_capacity()["provisioning"] == 8

    fleet["gpus"][3]["healthy"] = True
    c.gpu_file.write_text(json.dumps(fleet))
    adopted = c.cli_json("api", "nodes.adopt", "tenantId=root", f"nodeId={node}",
                         "reason=GPU 3 reseated")
    assert adopted["acceptance"]["attempt"] == 2
    eventually(lambda: c.cli("nodes", "get", node, "--query", "provisionState") == "adopted",
               "the second attempt adopts the node")
    assert c.events(node) == ["node.joined", "node.connected", "node.acceptance.started",
                              "node.acceptance.failed", "node.acceptance.started", "node.adopted"]
    assert c.gpu_capacity()["allocatable"] == 8
