"""The tutorial's real processes for end-to-end tests: the operator's CLI, GPU servers with bcd.

``Operator`` is the CLI as the platform operator types it (in-process, over
HTTPS to a real ``serve``). ``Machine`` is one GPU server under its own
BCD_ROOT with the fake GPU source, joined with ``bcd join`` and run with
``bcd node`` as real processes. ``running_cluster`` is the tutorial up to a
server that may join: a real server with the gateway, the site and the pool.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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

_PINS = (("servingCaSpkiPin", "--serving-ca-pin"),
         ("joinSigningKeyPin", "--join-signing-pin"),
         ("joinEncryptionKeyPin", "--join-encryption-pin"))


@dataclass
class Operator:
    env: dict[str, str]  # the CLI's environment: the server's URL, its CA file, the token

    def cli(self, *argv: str) -> str:
        code, out, err = cli_inprocess(list(argv), self.env)
        assert code == 0, (argv, err)
        return out.strip()

    def cli_json(self, *argv: str) -> Any:
        return json.loads(self.cli(*argv, "--output", "json"))

    def events(self, node: str) -> list[str]:
        return [e["type"] for e in self.cli_json("nodes", "events", node)]

    def provision_state(self, node: str) -> str:
        return self.cli("nodes", "get", node, "--query", "provisionState")

    def create_pool(self, folder: Path, policy_doc: Mapping[str, Any] | None = None) -> str:
        """The tutorial's site (shared, eu-1) and H100 pool; returns the pool's id."""
        policy = folder / "pool-policy.json"
        policy.write_text(json.dumps(POLICY if policy_doc is None else policy_doc))
        site = self.cli("sites", "create", "--kind", "shared", "--region", "eu-1",
                        "--key", "site-eu-1", "--query", "id")
        return self.cli("pools", "create", "--site", site, "--class", "metal-host",
                        "--gpu-model", "H100", "--policy-file", str(policy),
                        "--key", "pool-eu-1-h100", "--query", "id")


@dataclass
class Machine:
    """One GPU server: its own folder, BCD_ROOT and fake GPU source, and its bcd processes."""

    folder: Path
    serial: str = "SN-7701"
    agents: list[subprocess.Popen[str]] = field(default_factory=list)
    command: list[str] = field(default_factory=lambda: [BCD])  # how bcd is run (the single file)

    def __post_init__(self) -> None:
        self.root = self.folder / "root"
        self.root.mkdir(parents=True)
        self.gpu_file = self.folder / "gpus.json"
        write_fake_fleet_file(self.gpu_file, serial=self.serial)
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(self.folder),
                    "BCD_ROOT": str(self.root), "BCD_GPU_SOURCE": f"fake:{self.gpu_file}"}

    def bcd(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run([*self.command, *argv], self.env, cwd=self.folder, input="")

    def join(self, operator: Operator, server: Server | str, pool: str) -> str:
        """A join token for this serial, then `bcd join` with the pins against ``server`` (or
        that URL: a load balancer's); returns the node id."""
        operator.cli("join-tokens", "create", "--pool", pool, "--ttl", "2h", "--max-uses", "1",
                     "--expect-serial", self.serial, "--key", f"join-{self.serial.lower()}",
                     "--out", str(self.folder / "join-token"))
        pins: list[str] = []
        for name, flag in _PINS:
            pins += [flag, operator.cli("pki", "show", "--query", name)]
        url = server if isinstance(server, str) else server.url
        done = self.bcd("join", "--server", url + "/api/compute", *pins,
                        "--token-file", "./join-token")
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[2]  # "joined as node_… (site …"

    def start_agent(self, epoch: int = 1, *extra: str, drain: bool = False
                    ) -> subprocess.Popen[str]:
        """`bcd node` (with ``extra`` flags), once its session with the gateway is up at
        ``epoch``. ``drain``: from then on its output goes on into ``bcd.log`` in the
        machine's folder, for an agent that runs long (nothing reads its pipes else, and
        bcd blocks once one holds 64 KiB: seen at 53 KB after the HA module's faults)."""
        agent = subprocess.Popen([*self.command, "node", "--config", "/etc/bcd/config.toml",
                                  *extra],
                                 env=self.env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=self.folder)
        self.agents.append(agent)
        wait_for_line(agent, f"session connected (epoch {epoch})")
        if drain:
            log = self.folder / "bcd.log"
            for stream in (agent.stdout, agent.stderr):
                threading.Thread(target=_copy_lines, args=(stream, log), daemon=True).start()
        return agent

    def stop(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait(timeout=30)


def _copy_lines(stream: IO[str] | None, log: Path) -> None:
    """Every line of ``stream`` appended to ``log`` as it comes, until the stream ends."""
    if stream is None:
        return
    with log.open("a") as out:
        for line in stream:
            out.write(line)
            out.flush()


@dataclass
class Cluster(Operator):
    """A real server with the tutorial's pool, its operator, and one GPU server."""

    store_env: dict[str, str]  # the server's (and the store's) environment
    server: Server
    machine: Machine
    pool: str
    node: str = ""  # once joined
    log_file: Path | None = None  # serve's logs

    def join(self) -> str:
        self.node = self.machine.join(self, self.server, self.pool)
        return self.node

    def start_agent(self, epoch: int, *extra: str) -> subprocess.Popen[str]:
        try:
            return self.machine.start_agent(epoch, *extra)
        except AssertionError as failed:  # the gateway's side of a session that never came
            tail = self.log_file.read_text()[-4000:] if self.log_file else "(not kept)"
            raise AssertionError(f"{failed}; serve's log ends {tail!r}") from None

    def bcd(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.machine.bcd(*argv)

    def gpu_capacity(self) -> dict[str, int]:
        return self.cli_json("capacity", "--pool", self.pool)["resources"]["gpu"]  # type: ignore[no-any-return]

    def state(self, reservation: str) -> str:
        return self.cli("reservations", "get", reservation, "--query", "state")

    def spec_path(self, alloc: str) -> Path:
        """The CDI spec bcd writes for a hold: bcd-alloc_….json beside the vendor's."""
        return self.machine.root / "etc" / "cdi" / f"bcd-{alloc}.json"


@contextlib.contextmanager
def running_cluster(env: Mapping[str, str], tmp_path: Path, fast: Mapping[str, str],
                    policy: Mapping[str, Any] | None = None,
                    machine_folder: Path | None = None, serve_args: Sequence[str] = (),
                    log_file: Path | None = None) -> Iterator[Cluster]:
    """The tutorial up to "Join the server": ``serve`` with the gateway (its timers set by
    ``fast``; more flags in ``serve_args``, its logs into ``log_file``), the site and the
    pool (``policy``, default the tutorial's), and one machine (SN-7701, in
    ``machine_folder``, default under tmp_path) not yet joined."""
    token = initialize(env)
    store_env = {**env, **fast}
    # Always a file: a pipe nobody reads fills up and stops the server at its next log line.
    log_file = log_file or tmp_path / f"serve-{free_port()}.log"
    with serve(store_env, "--gateway-listen", f"127.0.0.1:{free_port()}", *serve_args,
               log_file=log_file) as server:
        operator = Operator(client_env(store_env, server, token))
        pool = operator.create_pool(tmp_path, policy)
        machine = Machine(machine_folder or tmp_path / "SN-7701")
        try:
            yield Cluster(operator.env, store_env, server, machine, pool, log_file=log_file)
        finally:
            machine.stop()


@contextlib.contextmanager
def adopted_cluster(env: Mapping[str, str], tmp_path: Path, fast: Mapping[str, str]
                    ) -> Iterator[Cluster]:
    """``running_cluster`` up to an adopted 8-GPU node whose bcd is running (epoch 1)."""
    with running_cluster(env, tmp_path, fast) as c:
        c.join()
        c.start_agent(epoch=1)
        eventually(lambda: c.provision_state(c.node) == "adopted", "the node is adopted")
        yield c
