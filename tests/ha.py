"""The high-availability layout for end-to-end tests: ``scripts/ha`` as an operator runs it.

``ha_layout`` brings up what docs/high-availability.md describes (etcd, two PostgreSQL
members under Patroni, three ``serve`` replicas, HAProxy) in a folder of its own with ports
chosen free, with ``scripts/ha up``, and takes it down after. ``Layout`` drives it through
the same script (``status --json``, ``restart``, ``kill``, ``start``): the tests exercise what
ships. ``Clients`` are callers of the API through HAProxy with the CLI's own HTTP client, each
creating a 1-GPU reservation with a key and releasing it, over and over, retrying a call with
the same key when it fails (what a user does with ``--key``), and keeping every answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventsourcing.application import AggregateNotFoundError

from better_compute.cli.client import HttpClient
from better_compute.domain.bookings import NodeBookings, bookings_uuid, overlaps
from better_compute.domain.errors import BetterComputeError
from tests.cluster import Machine, Operator
from tests.support import cli_inprocess, eventually

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "ha"
PARTS = ("haproxy", "r1", "r2", "r3", "pg1", "pg2", "etcd")


@dataclass
class Layout:
    dir: Path
    state: dict[str, Any]

    def ha(self, *argv: str, timeout: float = 600) -> str:
        done = subprocess.run([str(SCRIPT), *argv, "--dir", str(self.dir)], capture_output=True,
                              text=True, timeout=timeout)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-4000:])
        return done.stdout

    def status(self) -> dict[str, dict[str, Any]]:
        parts: dict[str, dict[str, Any]] = json.loads(self.ha("status", "--json"))["parts"]
        return parts

    def primary(self) -> str:
        roles = {name: part["role"] for name, part in self.status().items()
                 if name.startswith("pg")}
        leaders = [name for name, role in roles.items() if role == "primary"]
        assert len(leaders) == 1, roles
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


@contextlib.contextmanager
def ha_layout(settings: dict[str, str]) -> Iterator[Layout]:
    """``scripts/ha up --fast`` with these replica settings in a folder under /tmp (short
    paths for the sockets; reachable by ``nobody``, who runs PostgreSQL when the tests run
    as root); after, every part killed (``scripts/ha kill``: nothing is kept, so nothing
    needs a clean stop) and the folder gone."""
    folder = Path(tempfile.mkdtemp(prefix="bc-ha.", dir="/tmp"))
    folder.chmod(0o711)
    layout = Layout(folder, {})
    try:
        argv = ["up", "--fast"]
        for key, value in settings.items():
            argv += ["--env", f"{key}={value}"]
        layout.ha(*argv)
        layout.state = json.loads((folder / "state.json").read_text())
        yield layout
    finally:
        subprocess.run([str(SCRIPT), "kill", *PARTS, "--dir", str(folder)],
                       capture_output=True, timeout=300)
        shutil.rmtree(folder, ignore_errors=True)


def join_machines(layout: Layout, operator: Operator, pool: str, folder: Path,
                  count: int) -> list[tuple[Machine, str]]:
    """``count`` GPU servers joined through HAProxy, their bcd running and adopted."""
    machines = []
    for n in range(count):
        machine = Machine(folder / f"SN-77{n:02d}", serial=f"SN-77{n:02d}")
        node = machine.join(operator, layout.state["api_url"], pool)
        machine.start_agent(epoch=1)
        machines.append((machine, node))
    for _, node in machines:
        eventually(lambda n=node: operator.provision_state(n) == "adopted",  # type: ignore[misc]
                   f"{node} is adopted", timeout=90)
    return machines


@dataclass
class Answer:
    at: float  # monotonic, when the answer came
    method: str
    key: str
    code: str  # ok, or the error's stable code (the CLI's client rebuilds it)
    message: str = ""


@dataclass
class Clients:
    """``count`` callers through HAProxy until ``stop``; every answer kept in ``answers``."""

    env: dict[str, str]
    pool: str
    count: int
    run: str  # a prefix of every key: one run's keys are its own
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
        assert not any(t.is_alive() for t in self._threads), "a client hangs"

    def _call(self, client: HttpClient, method: str, params: dict[str, Any], key: str) -> Any:
        """One call, again with the same parameters (the same key) until it is answered."""
        while True:
            try:
                result = client.call(method, params)
            except BetterComputeError as exc:
                with self._lock:
                    self.answers.append(Answer(time.monotonic(), method, key, exc.code,
                                               exc.message[:300]))
                time.sleep(0.2)
                continue
            with self._lock:
                self.answers.append(Answer(time.monotonic(), method, key, "ok"))
            return result

    def _caller(self, n: int) -> None:
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


def store_verify(layout: Layout) -> dict[str, Any]:
    code, out, err = cli_inprocess(["store", "verify", "--output", "json"], layout.store_env())
    assert code == 0, (out[-3000:], err[-3000:])
    report: dict[str, Any] = json.loads(out)
    return report


def assert_everything_acknowledged_is_there(layout: Layout, clients: Clients,
                                            nodes: Sequence[str]) -> None:
    """Every reservation a client was told was created is in the store, released when its
    release was answered, and no GPU of a node is booked twice at once."""
    from better_compute.api.runtime import Runtime
    from better_compute.domain.ids import parse_id
    from better_compute.domain.reservation import Reservation

    runtime = Runtime.open(layout.store_env())
    try:
        repository = runtime.store.repository
        for key, rsv_id in clients.created.items():
            rsv: Any = repository.get(parse_id("rsv", rsv_id))
            assert isinstance(rsv, Reservation), (key, rsv_id)
            if rsv_id in clients.released:
                assert not rsv.live, (rsv_id, "released, but live in the store")
        booked = []
        for node in nodes:
            try:
                agg: Any = repository.get(bookings_uuid(node))
            except AggregateNotFoundError:  # nothing was ever placed on it
                continue
            assert isinstance(agg, NodeBookings)
            booked += [{**b, "node": node} for b in agg.bookings.values()]
        for i, x in enumerate(booked):
            for y in booked[i + 1:]:
                if x["node"] == y["node"] and overlaps(x["start"], x["end"], y["start"],
                                                       y["end"]):
                    assert not set(x["gpus"]) & set(y["gpus"]), ("booked twice", x, y)
    finally:
        runtime.close()
