"""What the benchmarks share to set up and to measure.

- ``store_env`` and ``drop_schema``: a throwaway store per backend (a data dir; on PostgreSQL
  a fresh schema, dropped after);
- ``initialized``: a store made ready the way ``better-compute init`` does (master key file,
  PKI sealed with it, the serving CA's file, the root token), opened as a ``Runtime``;
- ``serving``: a real ``better-compute serve`` process on that store, stopped on exit;
- ``free_port``, ``cpu_seconds``, ``load_average`` and ``cpu_ticks`` (the hypervisor's
  steal): what the figures are measured with;
  ``machine`` and ``pg_version``: what they ran on; ``postgres_pid``: the local PostgreSQL
  server, whose CPU the figures show beside the server's.
"""

from __future__ import annotations

import os
import platform
import socket
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the runtime loads the server's code: fleet_sim's agent processes skip it
    from better_compute.api.pki import PkiBundle
    from better_compute.api.runtime import Runtime

CLI = str(Path(sys.executable).parent / "better-compute")


def store_env(backend: str, pg_url: str | None, tmp: Path) -> dict[str, str]:
    """The environment of a fresh store of ``backend`` under ``tmp``."""
    env = {"BETTER_COMPUTE_DATA_DIR": str(tmp)}
    if backend == "postgres":
        if not pg_url:
            raise SystemExit("--backend postgres needs --pg-url (or BC_TEST_PG_URL)")
        from better_compute.api.store.store_url import with_schema

        env["BETTER_COMPUTE_DATABASE_URL"] = with_schema(pg_url, f"bench_{uuid.uuid4().hex[:12]}")
    return env


def drop_schema(env: Mapping[str, str]) -> None:
    """Drop the PostgreSQL schema ``store_env`` named (nothing on SQLite)."""
    url = env.get("BETTER_COMPUTE_DATABASE_URL")
    if url:
        import psycopg

        from better_compute.api.store.store_url import without_schema

        base, schema = without_schema(url)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@dataclass
class Initialized:
    """An initialized store, open: the runtime, the root token and the PKI bundle."""

    runtime: Runtime
    token: str
    bundle: PkiBundle  # the CAs and their keys (fleet_sim issues node certificates)


def initialized(env: dict[str, str]) -> Initialized:
    """Initialize the store of ``env`` as ``init`` does and open it; the caller closes it."""
    from better_compute.api import pki
    from better_compute.api.runtime import Runtime

    data = Path(env["BETTER_COMPUTE_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    key = pki.new_master_key()
    fd = os.open(data / "master.key", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key)
    runtime = Runtime.open(env)
    bundle = pki.generate_bundle()
    (data / "serving-ca.pem").write_text(pki.pem(bundle.serving_ca_cert))
    token = runtime.service.initialize(pki.public_parts(bundle),
                                       pki.seal_bundle(bundle, pki.parse_master_key(key)))
    return Initialized(runtime, str(token), bundle)


@contextmanager
def serving(env: dict[str, str], port: int, *extra: str, argv: Sequence[str] = (CLI,)
            ) -> Iterator[subprocess.Popen[str]]:
    """``serve --listen 127.0.0.1:PORT EXTRA…`` on ``env``'s store, once it says it serves;
    terminated (killed after 30 s) on exit. Its standard error goes to a temporary file (a
    pipe nobody reads would fill and stop the server); its tail is shown if it fails to start."""
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen([*argv, "serve", "--listen", f"127.0.0.1:{port}", *extra],
                                  env={"PATH": os.environ.get("PATH", ""), **env},
                                  stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            assert server.stdout is not None
            ready = server.stdout.readline()
            if "serving" not in ready:
                with suppress(subprocess.TimeoutExpired):
                    server.wait(timeout=10)  # its last words reach the log
                log.seek(0)
                raise SystemExit(f"serve did not start: {ready} {log.read()[-2000:]}")
            yield server
        finally:
            stop(server, 30)


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL when it has not ended within ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live descendants (Linux /proc; a
    ``serve`` forks its workers), 0 where unknown: steadier than wall time on a loaded
    machine."""
    total = 0.0
    pending = [pid]
    while pending:
        each = pending.pop()
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{each}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:  # gone meanwhile
            continue
    return total


def cpu_ticks() -> tuple[int, int]:
    """The machine's CPU time stolen by its hypervisor, and all of its CPU time, in clock ticks
    since boot (Linux /proc/stat; (0, 0) where unknown). On a shared virtual machine the
    steal between two readings says how much of the window other guests took."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_percent(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of the machine's CPU time stolen between two ``cpu_ticks`` readings."""
    total = after[1] - before[1]
    return 100 * (after[0] - before[0]) / total if total > 0 else 0.0


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def machine() -> dict[str, str]:
    """What the figures ran on: CPU, cores, memory, Python, SQLite, eventsourcing, OS."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    from importlib.metadata import version

    return {"cpu": cpu, "cores": str(os.cpu_count()), "memory": memory,
            "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "eventsourcing": version("eventsourcing"), "os": platform.platform()}


def pg_version(url: str) -> str:
    """The PostgreSQL server's version, for the figures' header."""
    import psycopg

    with psycopg.connect(url.partition("?")[0]) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def postgres_pid(url: str) -> int | None:
    """The PostgreSQL server's own process (its postmaster, whose children are the backends)
    when it runs on this machine, for its CPU beside the server's; None when it does not."""
    import psycopg

    with psycopg.connect(url.partition("?")[0]) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        stat = Path(f"/proc/{row[0]}/stat").read_text() if row else ""
    except OSError:  # another machine's
        return None
    return int(stat.rsplit(")", 1)[1].split()[1]) if stat else None
