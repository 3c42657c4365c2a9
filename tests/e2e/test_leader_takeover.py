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

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

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

# Fast timers so the test is short; leadership retries at the default (every second).
FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "3",
        "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}
TAKEOVER_WITHIN = 20.0  # seconds from the kill to the new node's adoption, all included




class Operator:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def cli(self, *argv: str) -> str:
        code, out, err = cli_inprocess(list(argv), self.env)
        assert code == 0, err
        return out.strip()

    def json(self, *argv: str) -> object:
        return json.loads(self.cli(*argv, "--output", "json"))

    def events(self, node: str) -> list[str]:
        docs = self.json("nodes", "events", node)
        assert isinstance(docs, list)
        return [e["type"] for e in docs]

    def state(self, node: str) -> str:
        return self.cli("nodes", "get", node, "--query", "provisionState")


class Machine:
    """One GPU server under its own BCD_ROOT, with the fake GPU source."""

    def __init__(self, tmp: Path, serial: str) -> None:
        self.work = tmp / serial
        self.root = self.work / "root"
        self.root.mkdir(parents=True)
        gpus = self.work / "gpus.json"
        write_fake_fleet_file(gpus, serial=serial)
        self.serial = serial
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.work),
                    "BCD_ROOT": str(self.root), "BCD_GPU_SOURCE": f"fake:{gpus}"}
        self.agent: subprocess.Popen[str] | None = None

    def join(self, operator: Operator, server: Server, pool: str) -> str:
        operator.cli("join-tokens", "create", "--pool", pool, "--ttl", "2h", "--max-uses", "1",
                     "--expect-serial", self.serial, "--out", str(self.work / "join-token"))
        pins: list[str] = []
        for name, flag in (("servingCaSpkiPin", "--serving-ca-pin"),
                           ("joinSigningKeyPin", "--join-signing-pin"),
                           ("joinEncryptionKeyPin", "--join-encryption-pin")):
            pins += [flag, operator.cli("pki", "show", "--query", name)]
        done = run([BCD, "join", "--server", server.url + "/api/compute", *pins,
                    "--token-file", "./join-token"], self.env, cwd=self.work)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[2]  # "joined as node_… (site …"

    def start(self) -> None:
        self.agent = subprocess.Popen([BCD, "node", "--config", "/etc/bcd/config.toml"],
                                      env=self.env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=self.work)
        wait_for_line(self.agent, "session connected (epoch 1)")

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.kill()
            self.agent.wait(timeout=30)


@pytest.fixture
def machines(tmp_path: Path) -> Iterator[list[Machine]]:
    made = [Machine(tmp_path, "SN-7701"), Machine(tmp_path, "SN-7702")]
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
        (tmp_path / "pool-policy.json").write_text(json.dumps(POLICY))
        site = operator.cli("sites", "create", "--kind", "shared", "--region", "eu-1",
                            "--key", "site-eu-1", "--query", "id")
        pool = operator.cli("pools", "create", "--site", site, "--class", "metal-host",
                            "--gpu-model", "H100", "--policy-file",
                            str(tmp_path / "pool-policy.json"), "--key", "pool-eu-1-h100",
                            "--query", "id")
        # Only the first replica runs: its controllers adopt the first node.
        node1 = first_machine.join(operator, first, pool)
        first_machine.start()
        eventually(lambda: operator.state(node1) == "adopted", "the first replica adopts node 1")

        with serve(env, "--gateway-listen", f"127.0.0.1:{free_port()}") as second:
            survivor = Operator(client_env(env, second, token))
            assert survivor.state(node1) == "adopted"  # one store behind both replicas
            first.kill()  # SIGKILL: no clean shutdown, the lock goes with the process
            killed = time.monotonic()

            node2 = second_machine.join(survivor, second, pool)
            assert survivor.state(node2) == "adopting"
            second_machine.start()
            eventually(lambda: survivor.state(node2) == "adopted",
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
            capacity = survivor.json("capacity", "--pool", pool)
            assert isinstance(capacity, dict)
            gpu = capacity["resources"]["gpu"]
            assert (gpu["allocatable"], gpu["unreachable"]) == (8, 8)
