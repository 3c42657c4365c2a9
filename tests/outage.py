"""Helpers of the store-outage tests: a PostgreSQL of one's own, a steady load, probes.

``throwaway_postgres`` starts a dedicated cluster with scripts/pg, so a test can stop it
(``pause``) and start it again (``resume``) without disturbing the suite's shared one.
``Load`` keeps calling the real server over HTTP in two threads (one writer, one reader)
and records every answer with its timing, so a test can say which calls were answered,
how fast, with what, and which writes were acknowledged.
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support import free_port

PG_SCRIPT = str(Path(__file__).resolve().parent.parent / "scripts" / "pg")
CALL_TIMEOUT = 60.0  # the client's patience; an answer must come far sooner than this


@dataclass
class Postgres:
    folder: str
    url: str

    def pause(self) -> None:
        subprocess.run([PG_SCRIPT, "pause", self.folder], check=True, capture_output=True)

    def resume(self) -> None:
        subprocess.run([PG_SCRIPT, "resume", self.folder], check=True, capture_output=True)


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster of the test's own (in /tmp: as root it runs as nobody)."""
    folder = tempfile.mkdtemp(prefix="bc-pg-outage.")
    started = subprocess.run([PG_SCRIPT, "start", folder, str(free_port())],
                             capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    try:
        yield Postgres(folder, started.stdout.strip())
    finally:
        subprocess.run([PG_SCRIPT, "stop", folder], capture_output=True)


@dataclass
class Outcome:
    method: str
    started: float  # time.monotonic() when the call was sent
    took: float
    result: Any = None
    error: str | None = None  # the JSON-RPC error's data.code, or how the HTTP call failed


def api_client(url: str, ca_file: Path | str, timeout: float = CALL_TIMEOUT) -> httpx.Client:
    verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(ca_file))
                                     if url.startswith("https") else False)
    return httpx.Client(base_url=f"{url}/api/compute", verify=verify, timeout=timeout)


def rpc_call(client: httpx.Client, token: str, method: str, params: dict[str, Any]) -> Outcome:
    started = time.monotonic()
    try:
        response = client.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": method,
                                             "params": params},
                               headers={"authorization": f"Bearer {token}"})
    except httpx.HTTPError as exc:
        return Outcome(method, started, time.monotonic() - started,
                       error=f"transport: {type(exc).__name__}: {exc}")
    took = time.monotonic() - started
    if response.status_code != 200:
        return Outcome(method, started, took, error=f"HTTP {response.status_code}")
    answer = response.json()
    if "error" in answer:
        return Outcome(method, started, took, error=str(answer["error"]["data"]["code"]))
    return Outcome(method, started, took, result=answer["result"])


@dataclass
class Load:
    """Steady calls against a server: sites.create (each with its own key) and system.whoami."""

    url: str
    token: str
    ca_file: Path | str
    pause: float = 0.05
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(kind,), daemon=True)
                         for kind in ("write", "read")]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=CALL_TIMEOUT + 10)

    def _run(self, kind: str) -> None:
        n = 0
        with api_client(self.url, self.ca_file) as client:
            while not self._stop.is_set():
                n += 1
                if kind == "write":
                    outcome = rpc_call(client, self.token, "sites.create",
                                       {"kind": "shared", "region": "eu-9", "key": f"load-{n}"})
                else:
                    outcome = rpc_call(client, self.token, "system.whoami", {})
                with self._lock:
                    self.outcomes.append(outcome)
                self._stop.wait(self.pause)

    def since(self, moment: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.started >= moment]

    def between(self, start: float, end: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if start <= o.started < end]

    def acknowledged_sites(self) -> set[str]:
        with self._lock:
            return {o.result["id"] for o in self.outcomes
                    if o.method == "sites.create" and o.error is None}

    def wait_for_success(self, method: str, after: float, timeout: float) -> Outcome:
        """The first call of ``method`` sent after ``after`` that succeeded."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for outcome in self.since(after):
                if outcome.method == method and outcome.error is None:
                    return outcome
            time.sleep(0.05)
        raise AssertionError(f"no {method} call sent after the mark succeeded within "
                             f"{timeout:.0f}s: {self.summary(after)}")

    def wait_for_error(self, method: str, after: float, timeout: float) -> Outcome:
        """The first call of ``method`` sent after ``after`` that failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for outcome in self.since(after):
                if outcome.method == method and outcome.error is not None:
                    return outcome
            time.sleep(0.05)
        raise AssertionError(f"no {method} call sent after the mark failed within "
                             f"{timeout:.0f}s: {self.summary(after)}")

    def summary(self, after: float = 0.0) -> str:
        counts: dict[str, int] = {}
        for o in self.since(after):
            key = f"{o.method}:{o.error or 'ok'}"
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def probe(url: str, ca_file: Path | str, path: str) -> tuple[int, Any]:
    """GET a probe route (health, ready): its status and JSON body."""
    with api_client(url, ca_file, timeout=30.0) as client:
        response = client.get(path)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text
