"""Failover under load: the faults of docs/high-availability.md, through scripts/ha's layout.

    .venv/bin/python -m better_compute.benchmarks.ha [--clients 16] [--agents 3]
        [--faults primary,replica,haproxy,rolling] [--settle 10] [--dir DIR]

``scripts/ha up --fast`` in a fresh folder (or ``--dir``'s layout), a pool, ``--agents`` GPU
servers whose bcd joined and connects through HAProxy, then for each fault ``--clients``
callers through HAProxy (the CLI's own HTTP client, each creating a 1-GPU reservation with a
key and releasing it, over and over, a failed call retried with the same key, as a user does
with ``--key``):

- ``primary``: the Patroni primary's host is lost (SIGKILL of Patroni and of every PostgreSQL
  process of it); the lost member is started again after (it rejoins as the standby);
- ``replica``: a ``serve`` replica killed (SIGKILL), started again after;
- ``haproxy``: HAProxy restarted (stopped and started: every connection through it ends);
- ``rolling``: the three replicas restarted one by one (``scripts/ha restart``: each drains).

For each: calls answered ok and failed (by code; ``cannot reach`` is the client's own
``unavailable`` when no answer came), the seconds from the fault to the last failure, the
slowest call, the agents' reconnections and the node.unreachable marks; every write a client
was told was done is checked in the store at the end, with ``store verify``. The load average
is printed beside every figure: the machine is shared.

``Layout`` and ``Clients`` are what tests/e2e/test_high_availability.py drives the layout
with, too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from better_compute.benchmarks.harness import CLI, load_average

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "ha"
BCD = str(Path(sys.executable).parent / "bcd")
PARTS = ("haproxy", "r1", "r2", "r3", "pg1", "pg2", "etcd")
POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}


@dataclass
class Layout:
    """A layout of ``scripts/ha``, driven through the script itself."""

    dir: Path
    state: dict[str, Any]

    @classmethod
    def up(cls, folder: Path, settings: dict[str, str]) -> Layout:
        """``scripts/ha up --fast`` with these replica settings (a layout already there is
        started again as it was)."""
        layout = cls(folder, {})
        argv = ["up", "--fast"]
        for key, value in settings.items():
            argv += ["--env", f"{key}={value}"]
        layout.ha(*argv)
        layout.state = json.loads((folder / "state.json").read_text())
        return layout

    def ha(self, *argv: str, timeout: float = 600) -> str:
        done = subprocess.run([str(SCRIPT), *argv, "--dir", str(self.dir)], capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"scripts/ha {' '.join(argv)}: {done.stdout[-2000:]}"
                                 f"{done.stderr[-4000:]}")
        return done.stdout

    def kill_all(self) -> None:
        subprocess.run([str(SCRIPT), "kill", *PARTS, "--dir", str(self.dir)],
                       capture_output=True, timeout=300)

    def status(self) -> dict[str, dict[str, Any]]:
        parts: dict[str, dict[str, Any]] = json.loads(self.ha("status", "--json"))["parts"]
        return parts

    def primary(self) -> str:
        roles = {name: part["role"] for name, part in self.status().items()
                 if name.startswith("pg")}
        leaders = [name for name, role in roles.items() if role == "primary"]
        if len(leaders) != 1:
            raise AssertionError(f"not one primary: {roles}")
        return leaders[0]

    def client_env(self) -> dict[str, str]:
        """What an operator exports: HAProxy's address and nothing else of the layout."""
        s = self.state
        return {"PATH": os.environ.get("PATH", ""), "HOME": str(self.dir),
                "BETTER_COMPUTE_URL": s["api_url"], "BETTER_COMPUTE_CA_FILE": s["ca_file"],
                "BETTER_COMPUTE_TOKEN": Path(s["token_file"]).read_text().strip(),
                "BETTER_COMPUTE_TENANT": "root",
                "BETTER_COMPUTE_DATA_DIR": str(self.dir / "not-used-by-http-clients")}

    def store_env(self) -> dict[str, str]:
        """The store's own environment (``store verify``, reading aggregates)."""
        s = self.state
        return {"PATH": os.environ.get("PATH", ""), "HOME": str(self.dir),
                "BETTER_COMPUTE_DATA_DIR": str(self.dir / "control"),
                "BETTER_COMPUTE_DATABASE_URL": s["database_url"]}

    def log(self, part: str) -> str:
        path = self.dir / part / "log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class Answer:
    at: float  # monotonic, when the answer came
    method: str
    key: str
    code: str  # ok, or the error's stable code (the CLI's client rebuilds it)
    message: str = ""
    seconds: float = 0.0  # how long the call took


@dataclass
class Clients:
    """``count`` callers through HAProxy until ``stop``; every answer kept in ``answers``."""

    env: dict[str, str]
    pool: str
    count: int
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])  # this run's keys' prefix
    answers: list[Answer] = field(default_factory=list)
    created: dict[str, str] = field(default_factory=dict)  # key -> acknowledged reservation
    released: set[str] = field(default_factory=set)  # reservations whose release was answered
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for n in range(self.count):
            thread = threading.Thread(target=self._caller, args=(n,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        if any(t.is_alive() for t in self._threads):
            raise AssertionError("a client hangs")

    def _call(self, client: Any, method: str, params: dict[str, Any], key: str) -> Any:
        """One call, again with the same parameters (the same key) until it is answered."""
        from better_compute.domain.errors import BetterComputeError

        while True:
            started = time.monotonic()
            try:
                result = client.call(method, params)
            except BetterComputeError as exc:
                now = time.monotonic()
                with self._lock:
                    self.answers.append(Answer(now, method, key, exc.code, exc.message[:300],
                                               now - started))
                time.sleep(0.2)
                continue
            now = time.monotonic()
            with self._lock:
                self.answers.append(Answer(now, method, key, "ok", "", now - started))
            return result

    def _caller(self, n: int) -> None:
        from better_compute.cli.client import HttpClient

        client = HttpClient(self.env["BETTER_COMPUTE_URL"], self.env["BETTER_COMPUTE_TOKEN"],
                            self.env)
        i = 0
        try:
            while not self._stop.is_set():
                key = f"{self.run}-{n}-{i}"
                created = self._call(client, "reservations.create",
                                     {"poolId": self.pool, "gpus": 1, "duration": "1h",
                                      "key": key}, key)
                with self._lock:
                    self.created[key] = created["id"]
                self._call(client, "reservations.release", {"reservationId": created["id"]},
                           key)
                with self._lock:
                    self.released.add(created["id"])
                i += 1
        finally:
            client.close()

    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.code != "ok"]

    def ok_after(self, moment: float) -> int:
        return sum(1 for a in self.answers if a.code == "ok" and a.at > moment)


def wait_until(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.2)


def check_acknowledged(layout: Layout, clients: Clients, nodes: list[str]) -> list[str]:
    """Problems with what the clients were told: a reservation acknowledged but not in the
    store, released but live, or a node's GPU booked twice at once."""
    from eventsourcing.application import AggregateNotFoundError

    from better_compute.api.runtime import Runtime
    from better_compute.domain.bookings import bookings_uuid, overlaps
    from better_compute.domain.ids import parse_id

    problems: list[str] = []
    runtime = Runtime.open(layout.store_env())
    try:
        repository = runtime.store.repository
        for key, rsv_id in clients.created.items():
            try:
                rsv: Any = repository.get(parse_id("rsv", rsv_id))
            except AggregateNotFoundError:
                problems.append(f"{rsv_id} (key {key}) acknowledged, not in the store")
                continue
            if rsv_id in clients.released and rsv.live:
                problems.append(f"{rsv_id} released, but live in the store")
        booked: list[dict[str, Any]] = []
        for node in nodes:
            try:
                agg: Any = repository.get(bookings_uuid(node))
            except AggregateNotFoundError:  # nothing was ever placed on it
                continue
            booked += [{**b, "node": node} for b in agg.bookings.values()]
        for i, x in enumerate(booked):
            for y in booked[i + 1:]:
                if x["node"] == y["node"] and overlaps(x["start"], x["end"], y["start"],
                                                       y["end"]) \
                        and set(x["gpus"]) & set(y["gpus"]):
                    problems.append(f"booked twice: {x} and {y}")
    finally:
        runtime.close()
    return problems


# ------------------------------------------------------------------ the benchmark's set-up

def _cli(env: dict[str, str], *argv: str) -> str:
    done = subprocess.run([CLI, *argv], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"better-compute {' '.join(argv)}: {done.stderr}")
    return done.stdout.strip()


def _json(env: dict[str, str], *argv: str) -> Any:
    return json.loads(_cli(env, *argv, "--output", "json"))


def make_pool(env: dict[str, str], folder: Path) -> str:
    policy = folder / "pool-policy.json"
    policy.write_text(json.dumps(POLICY))
    site = _cli(env, "sites", "create", "--kind", "shared", "--region", "eu-1", "--key",
                "site-eu-1", "--query", "id")
    return _cli(env, "pools", "create", "--site", site, "--class", "metal-host", "--gpu-model",
                "H100", "--policy-file", str(policy), "--key", "pool-eu-1-h100", "--query", "id")


def join_agent(env: dict[str, str], layout: Layout, pool: str, folder: Path, serial: str
               ) -> tuple[str, subprocess.Popen[bytes]]:
    """A GPU server: ``bcd join`` through HAProxy, then ``bcd node``; its node id and bcd."""
    from better_compute.agent.gpu import write_fake_fleet_file

    home = folder / serial
    (home / "root").mkdir(parents=True)
    write_fake_fleet_file(home / "gpus.json", serial=serial)
    agent_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
                 "BCD_ROOT": str(home / "root"), "BCD_GPU_SOURCE": f"fake:{home / 'gpus.json'}"}
    _cli(env, "join-tokens", "create", "--pool", pool, "--ttl", "2h", "--max-uses", "1",
         "--expect-serial", serial, "--out", str(home / "join-token"))
    pins = []
    for name, flag in (("servingCaSpkiPin", "--serving-ca-pin"),
                       ("joinSigningKeyPin", "--join-signing-pin"),
                       ("joinEncryptionKeyPin", "--join-encryption-pin")):
        pins += [flag, _cli(env, "pki", "show", "--query", name)]
    joined = subprocess.run([BCD, "join", "--server", layout.state["api_url"] + "/api/compute",
                             *pins, "--token-file", str(home / "join-token")], env=agent_env,
                            capture_output=True, text=True, timeout=120, cwd=home)
    if joined.returncode != 0:
        raise AssertionError(f"bcd join: {joined.stderr}")
    node = joined.stdout.split()[2]  # "joined as node_… (site …"
    log = open(home / "bcd.log", "ab")  # noqa: SIM115 (the child keeps it)
    with log:
        agent = subprocess.Popen([BCD, "node", "--config", "/etc/bcd/config.toml"],
                                 env=agent_env, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    return node, agent


def _sessions(env: dict[str, str], nodes: list[str]) -> dict[str, tuple[str, int]]:
    found = {}
    for node in nodes:
        doc = _json(env, "nodes", "get", node)
        found[node] = (str(doc["session"]["state"]), int(doc["session"]["epoch"]))
    return found


def _unreachable_marks(env: dict[str, str], nodes: list[str]) -> int:
    return sum(1 for node in nodes for e in _json(env, "nodes", "events", node)
               if e["type"] == "node.unreachable")


# ------------------------------------------------------------------------------ a fault

def run_fault(layout: Layout, env: dict[str, str], pool: str, nodes: list[str], fault: str,
              clients_count: int, settle: float) -> dict[str, Any]:
    before_sessions = _sessions(env, nodes)
    before_marks = _unreachable_marks(env, nodes)
    clients = Clients(env, pool, clients_count)
    clients.start()
    lost = ""
    try:
        wait_until(lambda: clients.ok_after(0) >= 2 * clients_count, "the clients call")
        started = time.monotonic()
        if fault == "primary":
            lost = layout.primary()
            layout.ha("kill", lost)
        elif fault == "replica":
            lost = "r2"
            layout.ha("kill", lost)
        elif fault == "haproxy":
            layout.ha("restart", "haproxy")
        else:
            layout.ha("restart", "r1", "r2", "r3")
        fault_done = time.monotonic()
        wait_until(lambda: clients.ok_after(fault_done) >= 2 * clients_count,
                   "the clients call again", timeout=120)
        back_at = time.monotonic()
        wait_until(lambda: all(s == "connected" for s, _ in _sessions(env, nodes).values()),
                   "every agent is connected", timeout=120)
        agents_at = time.monotonic()
        time.sleep(settle)
    finally:
        clients.stop()
    failed = clients.failed()
    codes: dict[str, int] = {}
    for answer in failed:
        kind = "cannot reach" if answer.message.startswith("cannot reach") else answer.code
        codes[kind] = codes.get(kind, 0) + 1
    after_sessions = _sessions(env, nodes)
    result = {
        "fault": fault,
        "calls": len(clients.answers),
        "ok": len(clients.answers) - len(failed),
        "failed": codes,
        "last failure after": (round(max(a.at for a in failed) - started, 1) if failed
                               else None),
        "fault took": round(fault_done - started, 1),
        "calls again after": round(back_at - started, 1),
        "agents connected after": round(agents_at - started, 1),
        "slowest call": round(max(a.seconds for a in clients.answers), 2),
        "agents reconnected": sum(1 for n in nodes
                                  if after_sessions[n][1] > before_sessions[n][1]),
        "unreachable marks": _unreachable_marks(env, nodes) - before_marks,
        "problems": check_acknowledged(layout, clients, nodes),
        "load": load_average(),
    }
    if lost:
        layout.ha("start", lost)  # the lost host comes back: as the standby, for a member
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--faults", default="primary,replica,haproxy,rolling")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds the clients call on after everything is back")
    parser.add_argument("--dir", help="the layout's folder (default: a fresh one, removed)")
    args = parser.parse_args(argv)
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bc-ha.", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o711)
    agents: list[subprocess.Popen[bytes]] = []
    print(f"load average {load_average()}: scripts/ha up in {folder}", flush=True)
    layout = Layout.up(folder, {"BETTER_COMPUTE_NODE_HEARTBEAT": "1",
                                "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER": "5"})
    try:
        env = layout.client_env()
        work = folder / "bench"
        work.mkdir(exist_ok=True)
        pool = make_pool(env, work)
        nodes = []
        for n in range(args.agents):
            node, agent = join_agent(env, layout, pool, work, f"SN-{uuid.uuid4().hex[:6]}-{n}")
            nodes.append(node)
            agents.append(agent)
        wait_until(lambda: all(_json(env, "nodes", "get", n)["provisionState"] == "adopted"
                               for n in nodes), "every node is adopted", timeout=120)
        print(f"load average {load_average()}: {len(nodes)} agents adopted", flush=True)
        for fault in args.faults.split(","):
            result = run_fault(layout, env, pool, nodes, fault, args.clients, args.settle)
            print(json.dumps(result), flush=True)
        code, out, _ = _verify(layout)
        print(f"store verify: exit {code}, {out}", flush=True)
    finally:
        for agent in agents:
            agent.kill()
            agent.wait(timeout=30)
        layout.kill_all()
        if not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def _verify(layout: Layout) -> tuple[int, str, str]:
    done = subprocess.run([CLI, "store", "verify", "--output", "json"], env=layout.store_env(),
                          capture_output=True, text=True, timeout=600)
    report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    summary = {k: report.get(k) for k in ("ok", "events", "gaps", "problems")}
    return done.returncode, json.dumps(summary), done.stderr


if __name__ == "__main__":
    sys.exit(main())
