"""``serve --workers N``: /metrics shows the server's totals, whichever worker is scraped.

Real processes over real TLS: the parent and its workers, kept-alive connections opened
until more than one worker holds one (which worker accepted a connection is read from
/proc: the socket's inode in the worker's descriptors). Calls are spread over those
connections, then every connection (so every worker) and the loopback listener (worker 0)
are scraped: each scrape counts every call. A worker killed with SIGKILL stops the server
(status 1) and its counters go with that run: the next run starts from zero (prometheus-
client's multiprocess files live in a directory of the run, removed when it ends). With no
--workers, serve starts one per core; systemd hears READY=1 from the main process; workers
die with a parent killed with SIGKILL.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import (
    CLI,
    eventually,
    free_port,
    initialize,
    serve,
    store_env,
    wait_for_line,
)

CALLS_PER_CONNECTION = 7


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _server_side_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the server's end of the loopback connection from ``client_port``."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port \
                and int(remote.split(":")[1], 16) == client_port:
            return fields[9]
    return None


class Connection:
    """One kept-alive HTTPS connection to the API, and the worker that accepted it."""

    def __init__(self, port: int, ca: Path) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        self.http = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=60)
        self.port = port

    def worker(self, workers: list[int]) -> int:
        assert self.http.sock is not None
        inode = _server_side_inode(self.port, self.http.sock.getsockname()[1])
        owners = [pid for pid in workers if inode in _socket_inodes(pid)]
        assert len(owners) == 1, (inode, owners)
        return owners[0]

    def rpc(self, token: str, method: str) -> dict[str, object]:
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": {}})
        self.http.request("POST", "/api/compute/rpc", body=body,
                          headers={"content-type": "application/json",
                                   "authorization": f"Bearer {token}"})
        answer = self.http.getresponse()
        doc: dict[str, object] = json.loads(answer.read())
        assert answer.status == 200, doc
        return doc

    def metrics(self, token: str) -> str:
        self.http.request("GET", "/metrics", headers={"authorization": f"Bearer {token}"})
        answer = self.http.getresponse()
        text = answer.read().decode()
        assert answer.status == 200, text
        return text


def whoami_count(text: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples
               if s.name == "better_compute_rpc_requests_total"
               and s.labels == {"method": "system.whoami", "code": "ok"})


def sample(text: str, name: str) -> float:
    values = [s.value for family in text_string_to_metric_families(text)
              for s in family.samples if s.name == name]
    assert len(values) == 1, (name, values)
    return values[0]


@contextmanager
def on_every_worker(stack: ExitStack, port: int, ca: Path, workers: list[int]
                    ) -> Iterator[dict[int, Connection]]:
    """A connection held by each worker: connect (the TLS handshake done, so accepted) until
    every worker holds one. The kernel picks the worker that accepts; 200 tries make a miss
    practically impossible."""
    held: dict[int, Connection] = {}
    for _ in range(200):
        connection = Connection(port, ca)
        stack.callback(connection.http.close)
        connection.http.connect()
        owner = connection.worker(workers)
        held.setdefault(owner, connection)
        if len(held) == len(workers):
            break
    assert len(held) == len(workers), f"connections reached only {sorted(held)} of {workers}"
    yield held


def test_a_scrape_on_any_worker_counts_the_calls_of_every_worker(env: dict[str, str]) -> None:
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    listener = free_port()
    with serve(env, "--workers", "2", "--metrics-listen", f"127.0.0.1:{listener}") as server, \
            ExitStack() as stack:
        workers = _children(server.process.pid)
        assert len(workers) == 2
        with on_every_worker(stack, server.port, ca, workers) as held:
            for connection in held.values():
                for _ in range(CALLS_PER_CONNECTION):
                    connection.rpc(token, "system.whoami")
            made = CALLS_PER_CONNECTION * len(held)
            for owner, connection in held.items():
                text = connection.metrics(token)
                assert whoami_count(text) == made, (owner, whoami_count(text), made)
                # worker 0 leads (once elected); every worker's scrape says so, once
                eventually(lambda c=connection: sample(  # type: ignore[misc]
                    c.metrics(token), "better_compute_controllers_leader") == 1,
                    f"worker {owner}'s scrape shows the leader")
            loopback = http.client.HTTPConnection("127.0.0.1", listener, timeout=60)
            stack.callback(loopback.close)
            loopback.request("GET", "/metrics")
            assert whoami_count(loopback.getresponse().read().decode()) == made


def test_a_killed_worker_stops_the_run_and_the_next_run_counts_from_zero(
        tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    token = initialize(env)
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    with serve(env, "--workers", "2") as server, ExitStack() as stack:
        workers = _children(server.process.pid)
        directory = _multiprocess_dir(workers[0])
        assert directory is not None and directory.is_dir()
        with on_every_worker(stack, server.port, ca, workers) as held:
            for connection in held.values():
                for _ in range(CALLS_PER_CONNECTION):
                    connection.rpc(token, "system.whoami")
            os.kill(workers[1], signal.SIGKILL)
            assert server.process.wait(timeout=60) == 1
        eventually(lambda: not directory.exists(), "the run's metrics directory removed")
    with serve(env, "--workers", "2") as server, ExitStack() as stack:
        workers = _children(server.process.pid)
        assert _multiprocess_dir(workers[0]) != directory
        with on_every_worker(stack, server.port, ca, workers) as held:
            first = next(iter(held.values()))
            first.rpc(token, "system.whoami")
            for connection in held.values():
                assert whoami_count(connection.metrics(token)) == 1


def _multiprocess_dir(pid: int) -> Path | None:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        name, _, value = item.partition(b"=")
        if name == b"PROMETHEUS_MULTIPROC_DIR":
            return Path(value.decode())
    return None


def _ready_line(env: dict[str, str], *wrap: str) -> tuple[str, list[int]]:
    """``serve`` with no --workers: its ready line and its worker processes."""
    process = subprocess.Popen([*wrap, CLI, "serve", "--listen", f"127.0.0.1:{free_port()}"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        line = wait_for_line(process, "serving ")
        return line, _children(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_serve_starts_a_worker_per_core_by_default(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    cores = len(os.sched_getaffinity(0))
    line, workers = _ready_line(env)
    if cores > 1:
        assert line.rstrip().endswith(f"({cores} workers)"), line
        assert len(workers) == cores
    else:
        assert "workers" not in line and not workers, line
    line, workers = _ready_line(env, "taskset", "-c", str(min(os.sched_getaffinity(0))))
    assert "workers" not in line and not workers, line  # one core: one process, as before


def test_systemd_hears_ready_and_stopping_from_the_main_process(tmp_path: Path) -> None:
    """Type=notify with NotifyAccess=main: systemd ignores a worker's READY=1, so the
    parent sends it, once every worker serves (the sender's pid checked with SO_PASSCRED)."""
    env = store_env("sqlite", tmp_path)
    initialize(env)
    folder = Path(tempfile.mkdtemp(prefix="bc-notify.", dir="/tmp"))  # sun_path: 108 bytes
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(str(folder / "notify"))
        sock.settimeout(60)
        try:
            with serve({**env, "NOTIFY_SOCKET": str(folder / "notify")}, "--workers", "2"
                       ) as server:
                assert _notification(sock) == (b"READY=1", server.process.pid)
            assert _notification(sock) == (b"STOPPING=1", server.process.pid)
            sock.settimeout(0.5)  # nothing more: the workers sent nothing
            try:
                extra: tuple[bytes, int] | None = _notification(sock)
            except TimeoutError:
                extra = None
            assert extra is None, extra
        finally:
            (folder / "notify").unlink()
            folder.rmdir()


def _notification(sock: socket.socket) -> tuple[bytes, int]:
    data, ancillary, _, _ = sock.recvmsg(64, socket.CMSG_SPACE(12))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid, _uid, _gid = struct.unpack("iii", payload[:12])
            return data, pid
    raise AssertionError(f"no sender credentials with {data!r}")


def test_the_workers_die_with_a_parent_killed_with_sigkill(tmp_path: Path) -> None:
    """kill -9 of the server leaves no worker serving on its socket (PR_SET_PDEATHSIG)."""
    env = store_env("sqlite", tmp_path)
    initialize(env)
    with serve(env, "--workers", "2") as server:
        workers = _children(server.process.pid)
        assert len(workers) == 2
        server.kill(signal.SIGKILL)
        for pid in workers:
            eventually(lambda pid=pid: _gone(pid), f"worker {pid} ended")  # type: ignore[misc]


def _gone(pid: int) -> bool:
    """``pid`` has exited (a zombie not yet reaped by whoever adopted it counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
