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
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from better_compute.agent.gpu import write_fake_fleet_file
from better_compute.domain.bookings import bookings_uuid
from tests.cdi_support import check_cdi_spec
from tests.support import (
    BCD,
    CLI,
    POLICY,
    cli_inprocess,
    client_env,
    eventually,
    free_port,
    initialize,
    open_runtime,
    run,
    serve,
    wait_for_line,
)

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}



class Watch:
    """`better-compute events watch` as a real process; a thread hands its lines over."""

    def __init__(self, env: dict[str, str], *argv: str) -> None:
        self.process = subprocess.Popen([CLI, "events", "watch", *argv], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put("")

    def until(self, event_type: str, timeout: float = 45.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while not any(e["type"] == event_type for e in self.events):
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {event_type} on events watch; saw "
                                     f"{[e['type'] for e in self.events]}") from None
            if not line:
                raise AssertionError(f"events watch ended: {self.process.stderr.read()}")  # type: ignore[union-attr]
            self.events.append(json.loads(line))
        return [e["type"] for e in self.events]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@dataclass
class Cluster:
    env: dict[str, str]
    op: dict[str, str]
    node_env: dict[str, str]
    work: Path
    root: Path
    pool: str
    node: str
    agents: list[subprocess.Popen[str]]

    def cli(self, *argv: str) -> str:
        code, out, err = cli_inprocess(list(argv), self.op)
        assert code == 0, (argv, err)
        return out.strip()

    def cli_json(self, *argv: str) -> Any:
        return json.loads(self.cli(*argv, "--output", "json"))

    def start_agent(self, epoch: int) -> subprocess.Popen[str]:
        agent = subprocess.Popen([BCD, "node", "--config", "/etc/bcd/config.toml"],
                                 env=self.node_env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=self.work)
        self.agents.append(agent)
        wait_for_line(agent, f"session connected (epoch {epoch})")
        return agent

    def state(self, rsv: str) -> str:
        return self.cli("reservations", "get", rsv, "--query", "state")

    def gpu_capacity(self) -> dict[str, int]:
        return self.cli_json("capacity", "--pool", self.pool)["resources"]["gpu"]  # type: ignore[no-any-return]

    def spec_path(self, alloc: str) -> Path:
        return self.root / "etc" / "cdi" / f"bcd-{alloc}.json"  # bcd-alloc_….json


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path) -> Iterator[Cluster]:
    """The tutorial up to an adopted 8-GPU node whose bcd is running (epoch 1)."""
    token = initialize(env)
    env = {**env, **FAST}
    with serve(env, "--gateway-listen", f"127.0.0.1:{free_port()}") as server:
        op = client_env(env, server, token)
        work = tmp_path / "work"
        work.mkdir()
        root = tmp_path / "bcd-root"
        root.mkdir()
        gpu_file = tmp_path / "gpus.json"
        write_fake_fleet_file(gpu_file, serial="SN-7701")
        node_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
                    "BCD_ROOT": str(root), "BCD_GPU_SOURCE": f"fake:{gpu_file}"}
        c = Cluster(env, op, node_env, work, root, "", "", [])
        (work / "pool-policy.json").write_text(json.dumps(POLICY))
        site = c.cli("sites", "create", "--kind", "shared", "--region", "eu-1", "--key",
                     "site-eu-1", "--query", "id")
        c.pool = c.cli("pools", "create", "--site", site, "--class", "metal-host",
                       "--gpu-model", "H100", "--policy-file", str(work / "pool-policy.json"),
                       "--key", "pool-eu-1-h100", "--query", "id")
        c.cli("join-tokens", "create", "--pool", c.pool, "--ttl", "2h", "--max-uses", "1",
              "--expect-serial", "SN-7701", "--key", "join-sn-7701", "--out",
              str(work / "join-token"))
        pins: list[str] = []
        for name, flag in (("servingCaSpkiPin", "--serving-ca-pin"),
                           ("joinSigningKeyPin", "--join-signing-pin"),
                           ("joinEncryptionKeyPin", "--join-encryption-pin")):
            pins += [flag, c.cli("pki", "show", "--query", name)]
        joined = run([BCD, "join", "--server", server.url + "/api/compute", *pins,
                      "--token-file", "./join-token"], node_env, cwd=work, input="")
        assert joined.returncode == 0, joined.stderr
        c.node = joined.stdout.split()[2]
        try:
            c.start_agent(epoch=1)
            eventually(lambda: c.cli("nodes", "get", c.node, "--query", "provisionState")
                       == "adopted", "the node is adopted")
            yield c
        finally:
            for agent in c.agents:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait(timeout=30)


def test_reserve_bind_use_release(cluster: Cluster) -> None:
    c = cluster
    watch = Watch(dict(c.op), "--types", "node.*,reservation.*", "--since", "0")
    try:
        preview = c.cli_json("capacity", "--preview", "--pool", c.pool, "--gpus", "4",
                             "--for", "2h")
        assert preview["fits"] is True and preview["nodeId"] == c.node

        code, out, err = cli_inprocess(["reserve", "--pool", c.pool, "--gpus", "4",
                                        "--for", "2h"], c.op)
        assert code == 0, err
        assert "idempotency key" in err
        placed = json.loads(out)
        rsv, alloc = placed["id"], placed["allocationId"]
        eventually(lambda: c.state(rsv) == "active", "the reservation is active")
        binding = c.cli_json("reservations", "get", rsv, "--query", "binding")
        assert binding["nodeId"] == c.node
        assert binding["cgroupParent"] == f"bcd-alloc-{alloc}.slice"
        assert binding["envFile"].endswith(f"/run/bcd/allocations/{alloc}.env")

        # Exactly the GPUs the store booked, read from the store itself.
        rt = open_runtime(c.env)
        try:
            booked = rt.store.repository.get(bookings_uuid(c.node)).bookings[alloc]["gpus"]
        finally:
            rt.close()
        assert sorted(binding["cdiDevices"]) == sorted(f"bcd.dev/gpu={g}" for g in booked)
        spec = json.loads(c.spec_path(alloc).read_text())
        check_cdi_spec(spec)
        assert sorted(f"{spec['kind']}={d['name']}" for d in spec["devices"]) == \
            sorted(binding["cdiDevices"])
        env_file = c.root / "run" / "bcd" / "allocations" / f"{alloc}.env"
        assert f"BCD_CGROUP_PARENT=bcd-alloc-{alloc}.slice" in env_file.read_text()

        gpu = c.gpu_capacity()
        assert (gpu["allocated"], gpu["available"]) == (4, 4)

        assert c.cli("release", rsv, "--query", "state") == "released"
        eventually(lambda: not c.spec_path(alloc).exists(), "bcd removed the hold's CDI spec")
        assert not env_file.exists()
        eventually(lambda: c.gpu_capacity()["available"] == 8, "available goes back up")
        types = [t for t in watch.until("reservation.released") if t.startswith("reservation.")]
        assert types == ["reservation.placed", "reservation.binding", "reservation.active",
                         "reservation.released"]
    finally:
        watch.stop()


def test_a_release_while_bcd_is_away_completes_when_it_returns(cluster: Cluster) -> None:
    c = cluster
    rsv = c.cli("reserve", "--pool", c.pool, "--gpus", "8", "--for", "1h", "--key", "away",
                "--query", "id")
    eventually(lambda: c.state(rsv) == "active", "the reservation is active")
    alloc = c.cli("reservations", "get", rsv, "--query", "allocationId")
    agent = c.agents[0]
    agent.send_signal(signal.SIGKILL)
    agent.wait(timeout=30)
    assert c.spec_path(alloc).exists()  # bcd never drops a hold on its own

    assert c.cli("release", rsv, "--query", "state") == "released"
    assert c.spec_path(alloc).exists()  # nobody on the node to act yet
    c.start_agent(epoch=2)
    eventually(lambda: not c.spec_path(alloc).exists(),
               "the returning bcd removes the released hold")
    assert c.gpu_capacity()["allocated"] == 0

