"""Test helpers: stores on both backends, the CLI in-process and as a real process, servers.

Factories, never shared mutable fixtures: each test builds what it needs.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from better_compute.api import pki
from better_compute.api.runtime import Runtime
from better_compute.api.store.store_url import with_schema
from better_compute.benchmarks.harness import drop_schema as drop_schema  # the tests use it too

VENV_BIN = Path(sys.executable).parent
# The tutorial's pool policy.
POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}
CLI = str(VENV_BIN / "better-compute")
BCD = str(VENV_BIN / "bcd")


def pg_url() -> str:
    url = os.environ.get("BC_TEST_PG_URL")
    if not url:
        raise RuntimeError(
            "PostgreSQL tests need BC_TEST_PG_URL: run scripts/test, which starts a throwaway "
            "PostgreSQL cluster and sets it (or set BC_TEST_BACKENDS=sqlite to run SQLite only)"
        )
    return url


def store_env(backend: str, tmp: Path) -> dict[str, str]:
    """A fresh, empty store of the given backend, as the environment that selects it."""
    data = tmp / "data"
    data.mkdir(parents=True, exist_ok=True)
    env = {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", "")}
    if backend == "postgres":
        schema = "t_" + uuid.uuid4().hex[:16]
        env["BETTER_COMPUTE_DATABASE_URL"] = with_schema(pg_url(), schema)
    return env


def initialize(env: Mapping[str, str]) -> str:
    """Initialize a store the way `better-compute init` does; returns the root token."""
    code, out, err = cli_inprocess(["init"], env)
    assert code == 0, err
    return out.strip().splitlines()[-1]


def cli_inprocess(argv: list[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    """Run the CLI's main() in this process with exactly ``env`` (fast; no subprocess)."""
    from better_compute.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse usage errors
                code = int(exc.code or 0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, out.getvalue(), err.getvalue()


def run(argv: list[str], env: Mapping[str, str], *, input: str | None = None,
        timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A real process, as a user types the command."""
    return subprocess.run(argv, env=dict(env), input=input, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def eventually(check: Callable[[], bool], what: str, timeout: float = 45.0) -> None:
    """Wait until ``check()`` holds, checking every 0.1 s: for state in other processes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")


# Ports for the tests' servers: below the kernel's ephemeral range (32768-60999), where the
# port the kernel picks for an outgoing connection (a client's, PostgreSQL's) never lands,
# and a band of its own for each pytest-xdist worker, so two workers never pick one port.
# A port from bind(("127.0.0.1", 0)) was in the ephemeral range: between the test picking it
# and its server binding it, another worker's test (or any outgoing connection) could take
# it (seen in CI: a gateway's bind failed with "Address already in use").
PORT_BASE = 20000
PORT_END = 32768  # the ephemeral range's start
_next_port: list[int] = []


def port_band(worker: str, workers: int) -> range:
    """The ports of pytest-xdist worker ``worker`` (gw0, gw1, …) of ``workers``: the range
    below the ephemeral ports split evenly, so the bands of any number of workers are apart."""
    count = max(workers, 1)
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = (PORT_END - PORT_BASE) // count
    start = PORT_BASE + (index % count) * width
    return range(start, start + width)


def free_port() -> int:
    """A port no one listens on, from this worker's band, each call a different one."""
    band = port_band(os.environ.get("PYTEST_XDIST_WORKER", "gw0"),
                     int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    start, width = band.start, len(band)
    if not _next_port:
        _next_port.append(start + (os.getpid() * 7) % width)
    for _ in range(width):
        port = start + (_next_port[0] - start) % width
        _next_port[0] = port + 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:  # in use (another run's server, a cluster): the next one
                continue
            return port
    raise AssertionError(f"no free port in {start}-{start + width - 1}")


@dataclass
class Server:
    process: subprocess.Popen[str]
    url: str
    port: int

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=30)


def tls_connect(port: int, ca: Path, *, timeout: float, source: str = "127.0.0.1"
                ) -> ssl.SSLSocket:
    """A raw TLS connection from ``source`` to a test server on loopback that trusts ``ca``;
    its reads time out after ``timeout`` seconds (tests of what the server does to it)."""
    context = ssl.create_default_context(cafile=str(ca))
    raw = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    sock = context.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.settimeout(timeout)
    return sock


def whoami_from(port: int, ca: Path, token: str, source: str,
                headers: Mapping[str, str] | None = None) -> httpx.Response:
    """``system.whoami`` over HTTPS from the loopback address ``source`` (another client, as
    the server's per-address bounds and logs see it)."""
    transport = httpx.HTTPTransport(verify=ssl.create_default_context(cafile=str(ca)),
                                    local_address=source)
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(f"https://127.0.0.1:{port}/api/compute/rpc",
                           json={"jsonrpc": "2.0", "id": 1, "method": "system.whoami"},
                           headers={"authorization": f"Bearer {token}", **(headers or {})})


def read_until_closed(sock: socket.socket,
                      ended: tuple[type[BaseException], ...] = (ConnectionResetError,)) -> bytes:
    """Everything the server sends until it ends the connection (an ``ended`` error is how
    an abort shows: what came before it still counts)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ended:
        pass
    return data


def wait_for_line(process: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    """Read the process's stdout until a line contains ``needle`` (no sleeping).

    Reads the pipe a byte at a time, never through ``process.stdout``'s buffer: a buffered
    read takes every line already in the pipe, where ``select`` no longer sees them (two
    lines printed together, and the second was never found), and lines after the one found
    stay in the pipe for whoever reads ``process.stdout`` next."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    line = bytearray()
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
        if byte == b"\n":
            text = line.decode(errors="replace")
            line.clear()
            seen.append(text)
            if needle in text:
                return text
    if line:
        seen.append(line.decode(errors="replace"))
    process.kill()
    stderr = process.stderr.read() if process.stderr else ""
    raise AssertionError(f"no line with {needle!r}; stdout={seen!r} stderr={stderr[-3000:]}")


@contextlib.contextmanager
def serve(env: Mapping[str, str], *extra: str, port: int | None = None,
          tls: bool = True, wrap: Sequence[str] = (),
          log_file: Path | None = None, workers: str | None = "1") -> Iterator[Server]:
    """A real `better-compute serve` process on loopback, TLS by default.

    ``workers``: ``--workers`` unless ``extra`` names it; one process unless a test is about
    workers (a worker per core made the end-to-end tests ~20 % slower on 2 cores:
    docs/performance.md); None runs what ships, the core count (the tutorial as written).

    ``wrap``: a command that runs it (``unshare … sh -c '…; exec "$@"' sh``), so that the
    process is the server itself. Its standard error (the logs) goes to ``log_file`` when
    given (a pipe nobody reads fills up).
    """
    port = port or free_port()
    argv = [*wrap, CLI, "serve", "--listen", f"127.0.0.1:{port}", *extra,
            *(("--workers", workers) if workers and "--workers" not in extra else ())]
    if not tls:
        argv.append("--insecure-loopback")
    log = open(log_file, "a") if log_file is not None else None  # noqa: SIM115
    process = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE,
                               stderr=log or subprocess.PIPE, text=True)
    server = Server(process, f"{'https' if tls else 'http'}://127.0.0.1:{port}", port)
    try:
        wait_for_line(process, "serving ")
        yield server
    finally:
        server.kill(signal.SIGTERM if process.poll() is None else signal.SIGKILL)
        if log is not None:
            log.close()


def client_env(env: Mapping[str, str], server: Server, token: str,
               tenant: str = "root") -> dict[str, str]:
    """What an operator exports to point the CLI at a server (tutorial, first section)."""
    data = Path(env["BETTER_COMPUTE_DATA_DIR"])
    return {
        "PATH": env.get("PATH", ""),
        "HOME": str(data),
        "BETTER_COMPUTE_URL": server.url,
        "BETTER_COMPUTE_TOKEN": token,
        "BETTER_COMPUTE_TENANT": tenant,
        "BETTER_COMPUTE_CA_FILE": str(data / "serving-ca.pem"),
        # A CLI pointed at a URL must not need the local store: keep it out of reach.
        "BETTER_COMPUTE_DATA_DIR": str(data / "not-used-by-http-clients"),
    }


def open_runtime(env: Mapping[str, str]) -> Runtime:
    return Runtime.open(dict(env))


def quick_init(runtime: Runtime) -> str:
    """Initialize through the service (no CLI): PKI bundle sealed under a throwaway key."""
    key = pki.new_master_key()
    bundle = pki.generate_bundle()
    return runtime.service.initialize(pki.public_parts(bundle),
                                      pki.seal_bundle(bundle, pki.parse_master_key(key)))


def initialized_runtime(env: Mapping[str, str]) -> Runtime:
    """A Runtime on an initialized store that keeps its master key (``nodes.join`` unseals
    the PKI with it); ``root_token`` is the root administrator's token."""
    rt = open_runtime(env)
    key = pki.new_master_key()
    bundle = pki.generate_bundle()
    rt.root_token = rt.service.initialize(  # type: ignore[attr-defined]
        pki.public_parts(bundle), pki.seal_bundle(bundle, pki.parse_master_key(key)))
    rt.service.master_key_text = lambda: key
    return rt
