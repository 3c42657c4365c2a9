"""Benchmark of a server under hostile load: its peak memory, and root's latency meanwhile.

    .venv/bin/python -m better_compute.benchmarks.hostile [--backend sqlite|postgres]
        [--pg-url postgresql://…] [--posts 4] [--post-mb 300] [--watchers 100]
        [--names 150] [--name-mb 1] [--selectors 10] [--events 2000] [--flood 600]
        [--seconds 10]

It makes a fresh store, starts a real ``better-compute serve`` over TLS, and
runs at once:

- ``--posts`` anonymous POSTs of ``--post-mb`` MB to /api/compute/rpc, half
  announced by Content-Length, half streamed chunked; each sends until the
  server cuts it off;
- ``--watchers`` /watch streams (a read-only token of tenant acme, and root's
  for half of them) that never read a byte, with tiny receive buffers;
- ``--names`` attempts by acme's admin to mint a token whose name is
  ``--name-mb`` MB (each a body just under the 1 MiB cap);
- ``--selectors`` threads sending ``capacity.preview`` with a selector of the
  maximal length (domain/selectors.py MAX_LENGTH), over and over, as acme's read-only token;
- ``--events`` sites created meanwhile by another root administrator's token (events
  the watchers do not read);
- ``--flood`` TLS connections opened from another address (127.0.0.9, so that the
  per-address bound is the attacker's, not root's) as fast as one thread can, just before
  the rest start, each held open saying nothing through the run: past
  ``http.max_connections_per_address`` they are refused (the server runs with a head
  timeout longer than the run, so that the held ones stay; the bounds' variables
  ``BETTER_COMPUTE_HTTP_MAX_CONNECTIONS*`` are passed on to it, to compare);
- root's ``system.whoami`` in a loop on one kept-alive connection, from a
  separate process (so the attackers' threads do not delay its own timing).

It samples the server's resident memory (VmRSS) every 20 ms and prints the
peak, and root's whoami p50/p99/max. The latency is printed, not asserted;
tests/e2e/test_hostile_memory.py asserts the memory bound with the same code.

    .venv/bin/python -m better_compute.benchmarks.hostile --edge none,pipelining,heads,silent,gateway,all
        [--edge-seconds 15] [--workers 2] [--backend sqlite|postgres]

runs the HTTP edge's attacks instead (issue 30), each phase on a fresh ``serve --workers N
--gateway-listen``: ``pipelining`` (4 connections pipelining ``GET /api/compute/health``
without reading), ``heads`` (heads of 50, 50, 50 and 200 MB, again and again), ``silent``
(50 connections that never speak from each of 100 addresses, kept up), ``gateway`` (250 such
from each of 5 addresses to the gateway), ``all`` (the four at once) and ``none`` (nothing:
what the machine's load alone costs). Meanwhile two probes, processes of their own, call
root's whoami on a fresh TLS connection each time and open a node's gateway session (its own
key and certificate) over and over. A line of JSON per phase: each worker's idle and peak
RSS, the calls answered and their p50/p99, the reconnects welcomed, what the attacks met,
and the load average. tests/e2e/test_edge_attacks.py asserts the memory bound and the
successes with the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from better_compute.benchmarks.harness import (
    CLI,
    drop_schema,
    free_port,
    load_average,
    serving,
    store_env,
)

MB = 1_000_000
FLOOD_FROM = "127.0.0.9"  # another client address than the others' (all on loopback)


@dataclass
class Scenario:
    posts: int = 4
    post_mb: int = 300
    watchers: int = 100
    names: int = 150
    name_mb: float = 1.0
    selectors: int = 10
    events: int = 500
    flood: int = 600
    seconds: float = 10.0


@dataclass
class Target:
    """A running server and what the attacks need of it."""

    url: str  # https://127.0.0.1:PORT
    pid: int
    ca_file: str
    tokens: dict[str, str]  # root, writer (root admin), admin (acme), reader (acme read-only)
    pool: str


@dataclass
class Report:
    rss_before_mb: float = 0.0
    rss_peak_mb: float = 0.0
    rss_after_mb: float = 0.0
    whoami_ms: list[float] = field(default_factory=list)
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)

    def pct(self, q: float) -> float:
        values = sorted(self.whoami_ms)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    def summary(self) -> dict[str, Any]:
        return {"rss_before_mb": round(self.rss_before_mb, 1),
                "rss_peak_mb": round(self.rss_peak_mb, 1),
                "rss_after_mb": round(self.rss_after_mb, 1),
                "whoami_calls": len(self.whoami_ms), "whoami_p50_ms": round(self.pct(0.5), 1),
                "whoami_p99_ms": round(self.pct(0.99), 1),
                "whoami_max_ms": round(max(self.whoami_ms, default=float("nan")), 1),
                "outcomes": {k: dict(v) for k, v in self.outcomes.items()}}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _tls(target: Target) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=target.ca_file)


def _raw(target: Target, rcvbuf: int | None = None, source: str | None = None
         ) -> ssl.SSLSocket:
    host, port = target.url.removeprefix("https://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source is not None:
        sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect((host, int(port)))
    return _tls(target).wrap_socket(sock, server_hostname=host)


def _status(sock: ssl.SSLSocket) -> str:
    try:
        head = sock.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
        return head.split(" ")[1] if " " in head else "closed"
    except OSError as exc:
        return type(exc).__name__


def anonymous_post(target: Target, megabytes: int, chunked: bool) -> str:
    """One huge anonymous POST: sends until the server stops it; its HTTP status."""
    sock = _raw(target)
    length = megabytes * MB
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {length}"
    sock.sendall(f"POST /api/compute/rpc HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 f"application/json\r\n{framing}\r\n\r\n".encode())
    chunk = b" " * 65536
    piece = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
    sent = 0
    try:
        while sent < length:
            sock.sendall(piece)
            sent += len(chunk)
    except OSError:
        pass  # cut off by the server: what is wanted
    status = _status(sock)
    sock.close()
    return f"{status} after {sent // MB} MB"


def silent_watcher(target: Target, token: str) -> ssl.SSLSocket:
    """A /watch stream whose reader never reads (a tiny receive buffer, nothing read)."""
    sock = _raw(target, rcvbuf=4096)
    sock.sendall(f"GET /api/compute/events/watch HTTP/1.1\r\nhost: x\r\n"
                 f"authorization: Bearer {token}\r\n\r\n".encode())
    return sock


def _rpc(http: httpx.Client, token: str, method: str, params: dict[str, Any]) -> str:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    try:
        response = http.post("/api/compute/rpc", content=json.dumps(body),
                             headers={"authorization": f"Bearer {token}",
                                      "content-type": "application/json"})
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if response.status_code != 200:
        return f"HTTP {response.status_code}"
    answer = response.json()
    return str(answer["error"]["data"]["code"]) if "error" in answer else "ok"


def max_selector() -> str:
    """A selector of the maximal length the server takes, of as many tokens as it can."""
    from better_compute.domain.selectors import MAX_LENGTH

    text = "index in [" + ",".join(str(i % 10) for i in range(MAX_LENGTH))
    return text[:MAX_LENGTH - 1].rsplit(",", 1)[0] + "]"


def attack(target: Target, scenario: Scenario) -> Report:
    """Run every attack at once against ``target``; the server's memory and root's latency."""
    return _Attack(target, scenario).run()


class _Attack:
    """One run of every attack at once: its threads, and what they count and measure."""

    def __init__(self, target: Target, scenario: Scenario) -> None:
        self.target, self.scenario = target, scenario
        self.report = Report(rss_before_mb=rss_mb(target.pid))
        self.outcomes: dict[str, Counter[str]] = {k: Counter() for k in
                                                  ("posts", "names", "selectors", "events",
                                                   "whoami", "flood")}
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> Report:
        target, scenario, report = self.target, self.scenario, self.report
        threading.Thread(target=self.sample, daemon=True).start()
        flood = self.open_flood()
        silent = [silent_watcher(target, target.tokens["reader" if i % 2 else "root"])
                  for i in range(scenario.watchers)]
        background = [threading.Thread(target=self.whoami, daemon=True)]
        background += [threading.Thread(target=self.selectors, daemon=True)
                       for _ in range(scenario.selectors)]
        finite = self.finite()
        started = time.monotonic()
        for thread in background + finite:
            thread.start()
        for thread in finite:
            thread.join()
        self.stop.wait(max(0.0, scenario.seconds - (time.monotonic() - started)))
        self.stop.set()
        for thread in background:
            thread.join(timeout=60)
        report.rss_peak_mb = max(report.rss_peak_mb, rss_mb(target.pid))
        self.end_flood(flood)
        for sock in silent:
            sock.close()
        report.rss_after_mb = rss_mb(target.pid)
        report.outcomes = self.outcomes
        return report

    def finite(self) -> list[threading.Thread]:
        """The attacks that end by themselves: the posts, the names and the events."""
        scenario = self.scenario
        threads = [threading.Thread(target=self.post, args=(i % 2 == 1,), daemon=True)
                   for i in range(scenario.posts)]
        per = [scenario.names // 5 + (1 if i < scenario.names % 5 else 0) for i in range(5)]
        threads += [threading.Thread(target=self.names, args=(n,), daemon=True) for n in per if n]
        threads += [threading.Thread(target=self.events, args=(range(i, scenario.events, 4),),
                                     daemon=True) for i in range(4)]
        return threads

    def note(self, kind: str, outcome: str) -> None:
        with self.lock:
            self.outcomes[kind][outcome] += 1

    def sample(self) -> None:
        while not self.stop.is_set():
            self.report.rss_peak_mb = max(self.report.rss_peak_mb, rss_mb(self.target.pid))
            self.stop.wait(0.02)

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.target.url, verify=_tls(self.target), timeout=120)

    def post(self, chunked: bool) -> None:
        self.note("posts", anonymous_post(self.target, self.scenario.post_mb, chunked=chunked))

    def names(self, count: int) -> None:
        name = "n" * int(self.scenario.name_mb * MB)
        with self.client() as http:
            for _ in range(count):
                self.note("names", _rpc(http, self.target.tokens["admin"], "tokens.create",
                                        {"role": "member", "name": name}))

    def selectors(self) -> None:
        params = {"poolId": self.target.pool, "gpus": 1, "duration": "1h",
                  "selector": max_selector()}
        with self.client() as http:
            while not self.stop.is_set():
                self.note("selectors", _rpc(http, self.target.tokens["reader"],
                                            "capacity.preview", params))

    def events(self, part: range) -> None:
        with self.client() as http:
            for i in part:
                self.note("events", _rpc(http, self.target.tokens["writer"], "sites.create",
                                         {"kind": "shared", "region": "eu-1",
                                          "name": f"site {i} " + "s" * 180}))

    def open_flood(self) -> list[ssl.SSLSocket]:
        """Open ``scenario.flood`` connections from one address, before the other attacks
        start (so that the handshakes do not queue behind them), and keep each open."""
        sockets = []
        for _ in range(self.scenario.flood):
            try:
                sockets.append(_raw(self.target, source=FLOOD_FROM))
            except OSError as exc:  # ended during its handshake
                self.note("flood", type(exc).__name__)
        return sockets

    def end_flood(self, sockets: list[ssl.SSLSocket]) -> None:
        """What became of each flood connection: ``held`` (open, nothing said), the HTTP
        status it was answered with (a refusal comes as soon as the handshake is done), or
        how it ended; then close them."""
        for sock in sockets:
            sock.setblocking(False)  # what has come, not what may: a held one says nothing
            try:
                head = sock.recv(4096)
                self.note("flood", head.split(b" ", 2)[1].decode() if head else "closed")
            except ssl.SSLWantReadError:  # no data (perhaps a TLS session ticket): held
                self.note("flood", "held")
            except OSError as exc:
                self.note("flood", type(exc).__name__)
            sock.close()

    def whoami(self) -> None:
        target = self.target
        probe = subprocess.Popen(
            [sys.executable, "-m", "better_compute.benchmarks.hostile", "--_whoami",
             target.url, target.ca_file, target.tokens["root"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert probe.stdin is not None and probe.stdout is not None
        self.stop.wait()
        probe.stdin.close()
        done = json.loads(probe.stdout.read())
        probe.wait(timeout=60)
        self.report.whoami_ms.extend(done["ms"])
        for outcome, count in done["outcomes"].items():
            self.outcomes["whoami"][outcome] += count


def _set_when_stdin_closes() -> threading.Event:
    """An event set when standard input closes (the benchmark's end, for a probe process)."""
    done = threading.Event()

    def wait() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    return done


def _whoami_probe(url: str, ca_file: str, token: str) -> None:
    """root's whoami in a loop until stdin closes; prints the latencies as JSON."""
    done = _set_when_stdin_closes()
    ms: list[float] = []
    outcomes: Counter[str] = Counter()
    with httpx.Client(base_url=url, verify=ssl.create_default_context(cafile=ca_file),
                      timeout=120) as http:
        while not done.is_set():
            started = time.perf_counter()
            outcome = _rpc(http, token, "system.whoami", {})
            ms.append((time.perf_counter() - started) * 1000)
            if outcome != "ok":
                outcomes[outcome] += 1
    print(json.dumps({"ms": ms, "outcomes": outcomes}))


# ------------------------------------------------------------- the edge (issue 30)

HEALTH = b"GET /api/compute/health HTTP/1.1\r\nhost: x\r\n\r\n"


def pipelined_unread(target: Target, megabytes: float, timeout: float = 60.0) -> str:
    """One anonymous TLS connection that writes ``GET /api/compute/health`` requests back to
    back (HTTP/1.1 pipelining) and reads nothing, until ``megabytes`` are sent or the server
    stops taking them: how it ended, and how much went."""
    sock = _raw(target, rcvbuf=4096)
    sock.settimeout(timeout)
    batch = HEALTH * (65536 // len(HEALTH))
    sent, outcome = 0, "all sent"
    try:
        while sent < megabytes * MB:
            sock.sendall(batch)
            sent += len(batch)
    except TimeoutError:
        outcome = "not taken"  # the server stopped reading (and kept the connection)
    except OSError as exc:
        outcome = type(exc).__name__  # the server ended it
    sock.close()
    return f"{outcome} after {sent // MB} MB"


def large_head(target: Target, megabytes: float) -> str:
    """One anonymous TLS connection whose request head is ``megabytes`` of 1 KB header
    lines: the status it was answered with, ``closed``, or how the sending ended."""
    sock = _raw(target)
    line = b"x-padding: " + b"a" * 1011 + b"\r\n"
    batch = b"GET /api/compute/health HTTP/1.1\r\nhost: x\r\n" + line * 63
    sent = 0
    try:
        while sent < megabytes * MB:
            sock.sendall(batch)
            sent += len(batch)
            batch = line * 64
        sock.sendall(b"\r\n")
    except OSError:
        pass  # cut off by the server: its answer, if any, is read below
    status = _status(sock)
    sock.close()
    return f"{status} after {sent // MB} MB"


def silent(port: int, addresses: list[str], each: int) -> list[socket.socket]:
    """TCP connections that never send a byte (no TLS ClientHello): ``each`` from every one
    of ``addresses`` (loopback addresses: 127.0.1.1, …)."""
    out = []
    for address in addresses:
        for _ in range(each):
            with contextlib.suppress(OSError):  # refused or reset at once: not held
                out.append(socket.create_connection(("127.0.0.1", port), timeout=30,
                                                    source_address=(address, 0)))
    return out


def ended(sockets: list[socket.socket]) -> list[socket.socket]:
    """Those of ``sockets`` the server has ended (readable: there is nothing else to read)."""
    poll = select.poll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd in by_fd:
        poll.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poll.poll(0)]


def still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the server has not ended."""
    return len(sockets) - len(ended(sockets))


def loopback_addresses(count: int, third: int) -> list[str]:
    """``count`` client addresses 127.0.THIRD.1 …"""
    return [f"127.0.{third}.{i}" for i in range(1, count + 1)]


def fresh_whoami(port: int, context: ssl.SSLContext, token: str) -> bool:
    """``system.whoami`` on a connection of its own (TCP, TLS, one call): answered?"""
    body = b'{"jsonrpc":"2.0","id":1,"method":"system.whoami"}'
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"POST /api/compute/rpc HTTP/1.1\r\nhost: x\r\ncontent-type: "
                         b"application/json\r\nconnection: close\r\nauthorization: Bearer "
                         + token.encode() + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
                         + body)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    except OSError:
        return False
    return answer.startswith(b"HTTP/1.1 200 ") and b'"result"' in answer


@dataclass
class NodeIdentity:
    """A node stored as a join stores it, with its own key and a certificate from the node
    CA: what a node needs to open a session with the gateway."""

    node_id: str
    cert_file: str
    key_file: str


def make_node(env: dict[str, str], folder: Path) -> NodeIdentity:
    """A node (and a pool for it) in ``env``'s initialized store, its key and certificate
    written to ``folder``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from better_compute.api import pki
    from better_compute.api.runtime import Runtime
    from better_compute.benchmarks.fleet import make_pool
    from better_compute.domain.access import LOCAL_OPERATOR
    from better_compute.domain.ids import new_uuid, public_id
    from better_compute.domain.node import NODE_ROLE, Node

    runtime = Runtime.open(env)
    try:
        bundle = pki.unseal_bundle(runtime.service.pki().sealed,
                                   pki.parse_master_key(runtime.master_key_text()))
        pool = make_pool(runtime.service, key="pool-edge", gpu_count=8)
        site = runtime.service.pool(LOCAL_OPERATOR, pool).site_id
        key = ec.generate_private_key(ec.SECP256R1())
        csr = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bcd")]))
               .sign(key, hashes.SHA256()))
        uuid = new_uuid()
        node_id = public_id("node", uuid)
        cert = pki.issue_node_certificate(bundle, csr, node_id, site)
        runtime.store.save(Node(
            id=uuid, tenant_id="root", pool_id=pool, site_id=site, join_token_id="jt_edge",
            role=NODE_ROLE, hardware_key="serial:EDGE-1",
            hardware={"cpus": 224, "memoryGib": 2015.56},
            gpus=[{"uuid": f"GPU-edge-{g}", "name": "NVIDIA H100 80GB HBM3", "healthy": True}
                  for g in range(8)],
            key_pin=pki.spki_pin(key.public_key()),
            certificate_serial=format(cert.serial_number, "x"),
            certificate_not_after=cert.not_valid_after_utc, bcd_version="edge"), actor="local")
    finally:
        runtime.close()
    identity = NodeIdentity(node_id, str(folder / "node.crt"), str(folder / "node.key"))
    Path(identity.cert_file).write_text(pki.pem(cert))
    Path(identity.key_file).write_text(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()).decode())
    return identity


def node_session(port: int, ca_file: str, node: NodeIdentity) -> bool:
    """A session opened as bcd opens one (TLS with the node certificate, then a Hello):
    welcomed?"""
    from better_compute.api.wire import gateway as wire

    context = ssl.create_default_context(cafile=ca_file)
    context.load_cert_chain(node.cert_file, node.key_file)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(wire.encode(wire.Hello(node_id=node.node_id, bcd_version="edge")))
            line = b""
            while not line.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    return False
                line += chunk
    except OSError:
        return False
    return isinstance(wire.decode_to_node(line), wire.Welcome)


ATTACKS = ("pipelining", "heads", "silent", "gateway")
PHASES = ("none", *ATTACKS, "all")  # none: the probes alone, what the machine's load costs


def workers_of(pid: int) -> list[int]:
    """A ``serve --workers N`` process's workers (its children), in the order started."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            children += [int(c) for c in (task / "children").read_text().split()]
    return sorted(children)


@dataclass
class EdgeTarget:
    """A ``serve --workers N --gateway-listen`` and what the edge attacks need of it."""

    api: Target
    gateway_port: int
    node: NodeIdentity
    workers: list[int]


def _probe(kind: str, target: EdgeTarget, stop: threading.Event) -> dict[str, Any]:
    """``fresh_whoami`` (``fresh``) or ``node_session`` (``node``) in a loop, in a process of
    its own (the attackers' threads do not delay its timing), until ``stop``: the latencies
    and the failures."""
    api = target.api
    argv = ([api.url, api.ca_file, api.tokens["root"]] if kind == "fresh" else
            [str(target.gateway_port), api.ca_file, target.node.node_id, target.node.cert_file,
             target.node.key_file])
    probe = subprocess.Popen([sys.executable, "-m", "better_compute.benchmarks.hostile",
                              f"--_{kind}", *argv], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert probe.stdin is not None and probe.stdout is not None
    stop.wait()
    probe.stdin.close()
    done: dict[str, Any] = json.loads(probe.stdout.read())
    probe.wait(timeout=60)
    return done


def _percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else None


def _probe_loop(call: Any) -> None:
    """``call()`` (True when it succeeded) in a loop until stdin closes; prints the
    latencies of the successes and the number of failures as JSON."""
    done = _set_when_stdin_closes()
    ms: list[float] = []
    failed = 0
    while not done.is_set():
        started = time.perf_counter()
        if call():
            ms.append((time.perf_counter() - started) * 1000)
        else:
            failed += 1
    print(json.dumps({"ms": ms, "failed": failed}))


class _Edge:
    """One phase of the edge attacks (``attacks``, a subset of ``ATTACKS``) for ``seconds``:
    each worker's peak memory, and what the probes and the attackers saw."""

    def __init__(self, target: EdgeTarget, attacks: set[str], seconds: float) -> None:
        self.target, self.attacks, self.seconds = target, attacks, seconds
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.outcomes: dict[str, Counter[str]] = {k: Counter() for k in attacks}
        self.peak = {pid: rss_mb(pid) for pid in target.workers}

    def run(self) -> dict[str, Any]:
        idle = dict(self.peak)
        threads = [threading.Thread(target=self.sample, daemon=True)]
        if "pipelining" in self.attacks:
            threads += [threading.Thread(target=self.pipelining, daemon=True)
                        for _ in range(4)]
        if "heads" in self.attacks:
            threads += [threading.Thread(target=self.heads, args=(mb,), daemon=True)
                        for mb in (50, 50, 50, 200)]
        if "silent" in self.attacks:  # 100 addresses, 50 each (the API's bound: 64 each)
            threads.append(threading.Thread(target=self.silent, daemon=True, args=(
                "silent", self.target.api.url.rsplit(":", 1)[1], loopback_addresses(100, 1),
                50)))
        if "gateway" in self.attacks:  # 5 addresses, 250 each (the gateway's bound: 256)
            threads.append(threading.Thread(target=self.silent, daemon=True, args=(
                "gateway", str(self.target.gateway_port), loopback_addresses(5, 2), 250)))
        for thread in threads:
            thread.start()
        probes: dict[str, dict[str, Any]] = {}
        probing = [threading.Thread(target=lambda k=kind: probes.__setitem__(
            k, _probe(k, self.target, self.stop)), daemon=True) for kind in ("fresh", "node")]
        for thread in probing:
            thread.start()
        self.stop.wait(self.seconds)
        self.stop.set()
        for thread in [*probing, *threads]:
            thread.join(timeout=120)
        whoami, node = probes["fresh"], probes["node"]
        calls = len(whoami["ms"]) + whoami["failed"]
        return {
            "workers_mb": [{"idle": round(idle[pid], 1), "peak": round(self.peak[pid], 1),
                            "growth": round(self.peak[pid] - idle[pid], 1)}
                           for pid in self.target.workers],
            "whoami_fresh": {"calls": calls,
                             "ok_percent": round(100 * len(whoami["ms"]) / calls, 2)
                             if calls else None,
                             "p50_ms": _percentile(whoami["ms"], 0.5),
                             "p99_ms": _percentile(whoami["ms"], 0.99)},
            "node_reconnects": {"ok": len(node["ms"]), "failed": node["failed"],
                                "p50_ms": _percentile(node["ms"], 0.5),
                                "p99_ms": _percentile(node["ms"], 0.99)},
            "outcomes": {k: dict(v) for k, v in self.outcomes.items()}}

    def note(self, kind: str, outcome: str, count: int = 1) -> None:
        with self.lock:
            self.outcomes[kind][outcome.split(" after ")[0]] += count

    def sample(self) -> None:
        while not self.stop.is_set():
            for pid in self.target.workers:
                self.peak[pid] = max(self.peak[pid], rss_mb(pid))
            self.stop.wait(0.02)

    def pipelining(self) -> None:
        while not self.stop.is_set():
            self.note("pipelining", pipelined_unread(self.target.api, 200, timeout=5))

    def heads(self, megabytes: int) -> None:
        while not self.stop.is_set():
            self.note("heads", large_head(self.target.api, megabytes))

    def silent(self, kind: str, port: str, addresses: list[str], each: int) -> None:
        """``each`` silent connections from every address, kept up: those the server
        ends are opened again."""
        held = {address: silent(int(port), [address], each) for address in addresses}
        while not self.stop.wait(0.5):
            for address, sockets in held.items():
                gone = set(ended(sockets))
                for sock in gone:
                    sock.close()
                if gone:
                    self.note(kind, "ended by the server", len(gone))
                    held[address] = [s for s in sockets if s not in gone] + silent(
                        int(port), [address], len(gone))
        for sockets in held.values():
            for sock in sockets:
                sock.close()


def edge(env: dict[str, str], tmp: Path, phases: list[str], seconds: float,
         workers: int) -> None:
    """Each phase on a fresh ``serve`` of the same store; a line of JSON per phase."""
    tokens = {"root": subprocess.run([CLI, "init"], env=env, capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1]}
    node = make_node(env, tmp)
    ca_file = str(tmp / "serving-ca.pem")
    for phase in phases:
        port, gateway = free_port(), free_port()
        with serving(env, port, "--workers", str(workers), "--gateway-listen",
                     f"127.0.0.1:{gateway}") as server:
            pids = workers_of(server.pid) if workers > 1 else [server.pid]
            target = EdgeTarget(Target(f"https://127.0.0.1:{port}", server.pid, ca_file,
                                       tokens, ""), gateway, node, pids)
            context = ssl.create_default_context(cafile=ca_file)
            for _ in range(40):  # every worker warm: code loaded, caches filled
                fresh_whoami(port, context, tokens["root"])
            node_session(gateway, ca_file, node)
            load = load_average()
            attacks = set(ATTACKS) if phase == "all" else {phase} - {"none"}
            report = _Edge(target, attacks, seconds).run()
        print(json.dumps({"phase": phase, "seconds": seconds, "workers": workers,
                          "load_average_before": load, "load_average_after": load_average(),
                          **report}), flush=True)


# ------------------------------------------------------------------------- main


def populate(env: dict[str, str]) -> tuple[dict[str, str], str]:
    """On an initialized store: tenant acme with an admin and a read-only token, another
    root administrator's token (``writer``: it writes the events, so that root's whoami
    never waits behind its own token's calls), and a pool offered to acme. Returns those
    tokens (``admin``, ``reader``, ``writer``) and the pool's id."""
    from better_compute.api.runtime import Runtime
    from better_compute.domain.access import LOCAL_OPERATOR

    runtime = Runtime.open(env)
    try:
        service = runtime.service
        service.tenants_create(LOCAL_OPERATOR, "acme", None)
        tokens = {role: service.tokens_create(LOCAL_OPERATOR, tenant, name, None)["token"]
                  for role, tenant, name in (("admin", "acme", "admin"),
                                             ("reader", "acme", "read-only"),
                                             ("writer", "root", "admin"))}
        site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, None)["id"]
        pool = service.pools_create(
            LOCAL_OPERATOR, site, "metal-host", "H100",
            {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}, None, None)["id"]
        service.pools_offer(LOCAL_OPERATOR, pool, "acme", {"gpu": 8})
    finally:
        runtime.close()
    return tokens, pool


def _probe_main(args: argparse.Namespace) -> None:
    """One of the probes a run starts in a process of its own (``--_whoami``, ``--_fresh``,
    ``--_node``)."""
    if args._whoami:
        _whoami_probe(*args._whoami)
    elif args._fresh:
        url, ca_file, token = args._fresh
        context = ssl.create_default_context(cafile=ca_file)
        _probe_loop(lambda: fresh_whoami(int(url.rsplit(":", 1)[1]), context, token))
    else:
        port, ca_file, node_id, cert, key = args._node
        _probe_loop(lambda: node_session(int(port), ca_file, NodeIdentity(node_id, cert, key)))


def _edge_main(args: argparse.Namespace) -> None:
    """``--edge PHASES`` on a fresh store of ``--backend``."""
    with tempfile.TemporaryDirectory() as tmp:
        # PYTHONPATH passed on: another checkout's code under test (as rpc_path --compare)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH")}
        env.update(store_env(args.backend, args.pg_url, Path(tmp)))
        try:
            edge(env, Path(tmp), args.edge.split(","), args.edge_seconds, args.workers)
        finally:
            drop_schema(env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m better_compute.benchmarks.hostile",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("BC_TEST_PG_URL"))
    defaults = Scenario()
    for name, value in vars(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--edge", metavar="PHASES", help="the edge's attacks instead (issue 30): "
                        "a comma-separated list of " + ", ".join(PHASES) + ", each on a fresh "
                        "server (all: every attack at once)")
    parser.add_argument("--edge-seconds", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=2, help="serve's, with --edge")
    parser.add_argument("--_whoami", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_fresh", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--_node", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._whoami or args._fresh or args._node:
        _probe_main(args)
        return 0
    if args.edge:
        unknown = set(args.edge.split(",")) - set(PHASES)
        if unknown:
            parser.error(f"--edge: no phase {', '.join(sorted(unknown))}; the phases are "
                         + ", ".join(PHASES))
        _edge_main(args)
        return 0
    scenario = Scenario(**{k: getattr(args, k) for k in vars(defaults)})
    with tempfile.TemporaryDirectory() as tmp:
        env = {"PATH": os.environ.get("PATH", ""),
               **store_env(args.backend, args.pg_url, Path(tmp))}
        try:
            done = subprocess.run([CLI, "init"], env=env, capture_output=True, text=True,
                                  check=True)
            tokens, pool = populate(env)
            tokens["root"] = done.stdout.strip().splitlines()[-1]
            port = free_port()
            # one process: the memory bound is a worker's (serve --workers N: each its own)
            env["BETTER_COMPUTE_HTTP_HEAD_TIMEOUT"] = "600s"  # the flood's held ones stay
            # The connection bounds as set where it runs (0 turns one off, to compare).
            env.update({k: v for k, v in os.environ.items()
                        if k.startswith("BETTER_COMPUTE_HTTP_MAX_CONNECTIONS")})
            with serving(env, port, "--workers", "1") as server:
                target = Target(f"https://127.0.0.1:{port}", server.pid,
                                str(Path(tmp) / "serving-ca.pem"), tokens, pool)
                load = load_average()
                report = attack(target, scenario)
        finally:
            drop_schema(env)
    summary = report.summary()
    print(f"backend {args.backend}; scenario {vars(scenario)}; load average before {load}, "
          f"after {load_average()}")
    print(f"server RSS: {summary['rss_before_mb']} MB before, peak {summary['rss_peak_mb']} MB, "
          f"{summary['rss_after_mb']} MB after")
    print(f"root system.whoami: {summary['whoami_calls']} calls, p50 "
          f"{summary['whoami_p50_ms']} ms, p99 {summary['whoami_p99_ms']} ms, max "
          f"{summary['whoami_max_ms']} ms")
    print("outcomes: " + json.dumps(summary["outcomes"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
