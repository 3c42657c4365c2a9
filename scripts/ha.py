"""The high-availability layout on one machine, on loopback (docs/high-availability.md).

scripts/ha (the shell wrapper: it installs Debian's packages when missing) runs this with the
checkout's .venv. Parts, each a process of its own with its folder under the state dir:

- ``etcd``: a one-member etcd, Patroni's store;
- ``pg1``, ``pg2``: PostgreSQL members managed by Patroni (run as ``nobody`` when root, as
  PostgreSQL refuses root): a primary and a synchronous standby (``synchronous_mode``: a
  commit is acknowledged once the standby has it, so a promoted standby has every
  acknowledged write);
- ``r1``, ``r2``, ``r3``: ``better-compute serve`` replicas with the agents' gateway, over
  the store's libpq multi-host URL (``target_session_attrs=read-write``: each connection
  goes to whichever member is the primary; docs/decisions.md);
- ``haproxy``: the API and the gateway, TCP passthrough (TLS and the agents' mutual TLS stay
  end to end), each replica health-checked on ``/api/compute/ready``.

Ports are chosen free once, at the first ``up``, and kept in ``state.json`` with everything
else a client or a test needs (the URLs, the CA and token files); ``up`` again after ``down``
starts the same layout on the same ports and data.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import random
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the checkout's .venv/bin
ROOT = os.geteuid() == 0
MEMBERS = ("pg1", "pg2")
REPLICAS = ("r1", "r2", "r3")
PARTS = ("etcd", *MEMBERS, *REPLICAS, "haproxy")
# HAProxy's health checks: every CHECK_INTER seconds; a replica leaves after FALL failed
# checks in a row and comes back after RISE good ones.
CHECK_INTER = 1.0
FALL = 2
RISE = 2
# A replica asked to stop answers 503 on /ready for DRAIN seconds before it stops taking
# calls: HAProxy's FALL checks (and one interval of phase) to take it out of rotation, plus
# uvicorn's 5 s keep-alive, after which no client still holds an idle connection to it that
# was opened before; each call answered meanwhile closes its connection (docs/high-availability.md).
KEEP_ALIVE = 5.0
DRAIN = FALL * CHECK_INTER + CHECK_INTER + KEEP_ALIVE
PATRONI_TTL = 10  # seconds without the leader's renewal before the standby takes over
START_TIMEOUT = 120.0  # seconds a part may take to come up under load


class HaError(Exception):
    """A one-line failure of this script (printed without a traceback)."""


# ------------------------------------------------------------------------------- the state

def _free_port(taken: set[int]) -> int:
    """A free loopback port from 10000-19999 (below the tests' bands and the kernel's
    ephemeral range, so no outgoing connection takes it meanwhile)."""
    for _ in range(1000):
        port = random.randrange(10000, 20000)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise HaError("no free port in 10000-19999")


class Layout:
    """The state dir: ``state.json`` and a folder per part (its log, its pid file)."""

    def __init__(self, folder: Path) -> None:
        self.dir = folder.resolve()
        self.file = self.dir / "state.json"
        self.state: dict[str, Any] = json.loads(self.file.read_text()) if self.file.exists() \
            else {}
        # The processes this run of the script started: how one ended is known only here.
        self.spawned: dict[str, subprocess.Popen[bytes]] = {}

    # -- what the state holds

    @property
    def exists(self) -> bool:
        return bool(self.state)

    def create(self, fast: bool, env: dict[str, str]) -> None:
        taken: set[int] = set()
        names = ["etcd", "etcd_peer", "api", "gateway"]
        names += [f"{m}{s}" for m in MEMBERS for s in ("", "_rest")]
        names += [f"{r}_{s}" for r in REPLICAS for s in ("api", "gateway", "metrics")]
        ports = {name: _free_port(taken) for name in names}
        hosts = ",".join(f"127.0.0.1:{ports[m]}" for m in MEMBERS)
        control = self.dir / "control"
        self.state = {
            "ports": ports,
            "fast": fast,
            "env": env,
            "drain": DRAIN,
            "api_url": f"https://127.0.0.1:{ports['api']}",
            "gateway_url": f"https://127.0.0.1:{ports['gateway']}",
            # libpq tries the members in order and keeps the one that takes writes.
            "database_url": f"postgresql://bc@{hosts}/postgres?target_session_attrs=read-write"
                            "&connect_timeout=2&application_name=better-compute",
            "ca_file": str(control / "serving-ca.pem"),
            "token_file": str(control / "root-token"),
            "master_key_file": str(control / "master.key"),
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        self.save()

    def save(self) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=2) + "\n")
        tmp.replace(self.file)

    def port(self, name: str) -> int:
        return int(self.state["ports"][name])

    def folder(self, part: str) -> Path:
        path = self.dir / part
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- processes

    def _marker(self, part: str) -> str:
        """What the command line of ``part``'s process holds, and no other's."""
        if part in REPLICAS:
            return f"127.0.0.1:{self.port(part + '_api')}"
        return str(self.dir / part)

    def pid(self, part: str) -> int | None:
        """The pid of ``part`` when it runs (its pid file names a live process of this
        layout, checked by its command line: never another process that took the pid)."""
        pid_file = self.dir / part / "pid"
        try:
            pid = int(pid_file.read_text())
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            return None
        if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
            return None
        return pid if self._marker(part) in cmdline else None

    def spawn(self, part: str, argv: list[str], env: dict[str, str], *,
              server_user: bool = False) -> int:
        folder = self.folder(part)
        log = open(folder / "log", "ab")  # noqa: SIM115 (the child keeps it)
        if server_user and ROOT:
            argv = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv]
        with log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env, cwd=folder,
                                       start_new_session=True)
        (folder / "pid").write_text(str(process.pid))
        self.spawned[part] = process
        return process.pid

    def running(self, part: str) -> bool:
        """Whether ``part`` runs: for a process this run started, until it ends (its pid
        file's check by command line would be wrong meanwhile: the kernel closes the exec
        pipe that ``Popen`` waits on a moment before the new program's command line is
        readable, so a loaded machine can see it empty); else by its pid file."""
        process = self.spawned.get(part)
        if process is not None:
            return process.poll() is None
        return self.pid(part) is not None

    def ended(self, part: str) -> str:
        """How ``part``'s process that this run started ended ("" when it did not, or when
        another run started it)."""
        process = self.spawned.get(part)
        code = process.poll() if process is not None else None
        if code is None:
            return ""
        if code < 0:
            return f" (killed by {signal.Signals(-code).name})"
        return f" (exited with status {code})"

    def log_tail(self, part: str, lines: int = 15) -> str:
        path = self.dir / part / "log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def wait_for(check: Callable[[], bool], what: str, timeout: float = START_TIMEOUT,
             layout: Layout | None = None, part: str | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # not up yet: connection refused, a half-written file …
            pass
        if layout is not None and part is not None and not layout.running(part):
            raise HaError(f"{what}: {part} is not running{layout.ended(part)}\n"
                          f"{part}'s log ends:\n{layout.log_tail(part)}")
        if time.monotonic() > deadline:
            tail = f"\n{part}'s log ends:\n{layout.log_tail(part)}" if layout and part else ""
            raise HaError(f"{what}: not within {timeout:.0f}s{tail}")
        time.sleep(0.2)


def _get(url: str, context: ssl.SSLContext | None = None, timeout: float = 3.0
         ) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            return int(answer.status), bytes(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), bytes(error.read())


def _server_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def _find(name: str, *more: str) -> str:
    found = shutil.which(name) or next((c for c in more if Path(c).is_file()), None)
    if found is None:
        raise HaError(f"{name} is not installed: scripts/ha installs it (apt-get, as root)")
    return found


def _pg_bin() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        raise HaError("PostgreSQL is not installed: scripts/ha installs it (apt-get, as root)")
    return found[-1].parent


# ------------------------------------------------------------------------------- the parts

def start_etcd(layout: Layout) -> None:
    client, peer = layout.port("etcd"), layout.port("etcd_peer")
    folder = layout.folder("etcd")
    layout.spawn("etcd", [
        _find("etcd"), "--name", "ha", "--data-dir", str(folder / "data"),
        "--listen-client-urls", f"http://127.0.0.1:{client}",
        "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"ha=http://127.0.0.1:{peer}",
        "--logger", "zap", "--log-level", "warn"], _server_env())
    wait_for(lambda: _get(f"http://127.0.0.1:{client}/health")[0] == 200, "etcd answers",
             layout=layout, part="etcd")


def _patroni_config(layout: Layout, member: str) -> str:
    folder = layout.folder(member)
    port, rest = layout.port(member), layout.port(member + "_rest")
    fast = layout.state.get("fast")
    # Every commit waits for the synchronous standby (synchronous_commit on, the default):
    # what a client was told is saved survives the primary's host. ``--fast`` skips fsync
    # (a process killed keeps what it wrote in the kernel; a power cut would not).
    params = {"max_connections": 300, "wal_log_hints": "on", "wal_keep_size": "256MB",
              **({"fsync": "off"} if fast else {})}
    dcs = {"ttl": PATRONI_TTL, "loop_wait": 1, "retry_timeout": 4,
           "synchronous_mode": True, "maximum_lag_on_failover": 1048576,
           "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": params}}
    config = {
        "scope": "better-compute",
        "namespace": "/better-compute-ha/",
        "name": member,
        "log": {"level": "WARNING"},
        "restapi": {"listen": f"127.0.0.1:{rest}", "connect_address": f"127.0.0.1:{rest}"},
        "etcd3": {"hosts": [f"127.0.0.1:{layout.port('etcd')}"]},
        "bootstrap": {
            "dcs": dcs,
            "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}, *(["no-sync"] if fast else [])],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{port}", "connect_address": f"127.0.0.1:{port}",
            "data_dir": str(folder / "data"), "bin_dir": str(_pg_bin()),
            "pgpass": str(folder / "pgpass"),
            "authentication": {"superuser": {"username": "bc"},
                               "replication": {"username": "bc"},
                               "rewind": {"username": "bc"}},
            "parameters": {"unix_socket_directories": str(folder)},
            # Loopback only, so trust: production's are in docs/high-availability.md.
            "pg_hba": ["local all all trust", "local replication all trust",
                       "host all all 127.0.0.1/32 trust",
                       "host replication all 127.0.0.1/32 trust"],
        },
    }
    path = folder / "patroni.yml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # YAML reads JSON
    return str(path)


def _as_server_user(path: Path) -> None:
    if ROOT:
        shutil.chown(path, "nobody", "nogroup")


def patroni(layout: Layout, member: str) -> dict[str, Any]:
    """The member's own view (Patroni's REST API), or {} when it does not answer."""
    try:
        status, body = _get(f"http://127.0.0.1:{layout.port(member + '_rest')}/patroni",
                            timeout=2)
    except OSError:
        return {}
    return dict(json.loads(body)) if status in (200, 503) else {}


def member_role(info: dict[str, Any]) -> str:
    role = str(info.get("role") or "")
    if role in ("master", "primary"):
        return "primary"
    if role == "replica":
        return "synchronous standby" if info.get("sync_standby") else "standby"
    return role or "down"


def start_member(layout: Layout, member: str) -> None:
    folder = layout.folder(member)
    _as_server_user(folder)
    layout.dir.chmod(layout.dir.stat().st_mode | 0o011)  # nobody reaches its folder
    config = _patroni_config(layout, member)
    _as_server_user(Path(config))
    layout.spawn(member, [_find("patroni"), config], _server_env(), server_user=True)


def primary(layout: Layout) -> str | None:
    for member in MEMBERS:
        info = patroni(layout, member)
        if member_role(info) == "primary" and info.get("state") == "running":
            return member
    return None


def wait_members(layout: Layout, members: tuple[str, ...] = MEMBERS) -> None:
    """One member leads and takes writes; every other running one streams synchronously."""
    wait_for(lambda: primary(layout) is not None, "a PostgreSQL primary", layout=layout,
             part=members[0])
    for member in members:
        if member != primary(layout) and layout.pid(member):
            wait_for(lambda m=member: member_role(patroni(layout, m)) == "synchronous standby",  # type: ignore[misc]
                     f"{member} streaming as the synchronous standby", layout=layout,
                     part=member)


def _replica_env(layout: Layout, replica: str) -> dict[str, str]:
    s = layout.state
    return {
        **_server_env(),
        "HOME": str(layout.folder(replica)),
        "BETTER_COMPUTE_DATA_DIR": str(layout.folder(replica)),
        "BETTER_COMPUTE_MASTER_KEY_FILE": s["master_key_file"],
        "BETTER_COMPUTE_DATABASE_URL": s["database_url"],
        # Stop: /ready 503 for this long first, so HAProxy takes the replica out of rotation.
        "BETTER_COMPUTE_SHUTDOWN_DRAIN": f"{s['drain']:g}",
        # Every client and every agent arrives from HAProxy's address: the per-address
        # bounds would count them all as one (HAProxy bounds its own; docs/high-availability.md).
        "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS_PER_ADDRESS": "0",
        "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES_PER_ADDRESS": "0",
        "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES_PER_ADDRESS": "0",
        **s.get("env", {}),
    }


def init_store(layout: Layout) -> None:
    s = layout.state
    if Path(s["token_file"]).exists():
        return
    control = layout.folder("control")
    env = {**_server_env(), "HOME": str(control), "BETTER_COMPUTE_DATA_DIR": str(control),
           "BETTER_COMPUTE_DATABASE_URL": s["database_url"]}
    done = subprocess.run([str(BIN / "better-compute"), "init", "--out", s["token_file"]],
                          env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise HaError(f"better-compute init failed: {done.stderr.strip()}")


def ca_context(layout: Layout) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=layout.state["ca_file"])


def replica_ready(layout: Layout, replica: str) -> tuple[int, str]:
    """The replica's own /ready: its status code and reason (0 when it does not answer)."""
    try:
        status, body = _get(f"https://127.0.0.1:{layout.port(replica + '_api')}"
                            "/api/compute/ready", ca_context(layout), timeout=3)
    except OSError as exc:
        return 0, str(exc)
    try:
        return status, str(json.loads(body).get("reason") or json.loads(body)["status"])
    except (ValueError, KeyError):
        return status, body[:100].decode(errors="replace")


def start_replica(layout: Layout, replica: str) -> None:
    p = layout.port
    layout.spawn(replica, [
        str(BIN / "better-compute"), "serve",
        "--listen", f"127.0.0.1:{p(replica + '_api')}",
        "--gateway-listen", f"127.0.0.1:{p(replica + '_gateway')}",
        # What agents are told to connect to: HAProxy, never this replica.
        "--gateway-url", layout.state["gateway_url"],
        "--metrics-listen", f"127.0.0.1:{p(replica + '_metrics')}",
        "--workers", "1"], _replica_env(layout, replica))


def wait_replica(layout: Layout, replica: str) -> None:
    wait_for(lambda: replica_ready(layout, replica)[0] == 200, f"{replica} ready",
             layout=layout, part=replica)


def _haproxy_config(layout: Layout) -> str:
    p = layout.port
    ca = layout.state["ca_file"]
    inter = f"{int(CHECK_INTER * 1000)}ms"
    check = (f"check check-ssl verify required ca-file {ca} inter {inter} fall {FALL} "
             f"rise {RISE}")
    # HTTP/1.1 checks over TLS of the replica's API port, for both backends.
    http_check = ("    option httpchk\n"
                  "    http-check send meth GET uri {uri} ver HTTP/1.1 hdr Host 127.0.0.1\n"
                  "    http-check expect status 200\n")
    lines = [
        "global",
        "    log stderr format raw local0 notice",
        # Two descriptors a connection (client and replica side), within this process's limit.
        f"    maxconn {max(1000, (resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 200) // 2)}",
        f"    stats socket {layout.dir / 'haproxy' / 'admin.sock'} mode 600 level admin",
        "",
        "defaults",
        "    log global",
        "    mode tcp",
        "    option dontlognull",
        "    timeout connect 2s",
        "    timeout check 2s",
        # Agents' sessions, /watch streams and kept-alive calls: each side sends at least
        # every few seconds (heartbeats), so this only ends connections that went silent.
        "    timeout client 10m",
        "    timeout server 10m",
        "    retries 2",
        "    option redispatch",
        "",
    ]
    for name in ("api", "gateway"):
        lines += [
            f"frontend {name}",
            f"    bind 127.0.0.1:{p(name)}",
            # When no replica is ready (the database is failing over: every replica's /ready
            # says 503), the live ones still answer each call with `unavailable`, which a
            # client retries, rather than HAProxy closing the connection.
            f"    use_backend {name}_live if {{ nbsrv({name}) eq 0 }}",
            f"    default_backend {name}",
            "",
        ]
        for backend, uri in ((name, "/api/compute/ready"), (f"{name}_live",
                                                             "/api/compute/health")):
            lines += [f"backend {backend}", "    balance leastconn",
                      http_check.format(uri=uri).rstrip("\n")]
            for replica in REPLICAS:
                target = p(f"{replica}_{name}")
                health_port = "" if name == "api" else f" port {p(replica + '_api')}"
                lines.append(f"    server {replica} 127.0.0.1:{target} {check}{health_port}")
            lines.append("")
    folder = layout.folder("haproxy")
    path = folder / "haproxy.cfg"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def haproxy_stats(layout: Layout) -> dict[tuple[str, str], dict[str, str]]:
    """HAProxy's ``show stat``, by (backend, server)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(3)
        s.connect(str(layout.dir / "haproxy" / "admin.sock"))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    text = data.decode().lstrip("# ")
    return {(row["pxname"], row["svname"]): row for row in csv.DictReader(io.StringIO(text))}


def in_rotation(layout: Layout, replica: str) -> bool:
    stats = haproxy_stats(layout)
    return all(stats[(b, replica)]["status"].startswith("UP") for b in ("api", "gateway"))


def start_haproxy(layout: Layout) -> None:
    config = _haproxy_config(layout)
    haproxy = _find("haproxy", "/usr/sbin/haproxy")
    checked = subprocess.run([haproxy, "-c", "-q", "-f", config], capture_output=True,
                             text=True)
    if checked.returncode != 0:
        raise HaError(f"haproxy refuses {config}: {checked.stdout}{checked.stderr}")
    layout.spawn("haproxy", [haproxy, "-db", "-f", config], _server_env())
    running = [r for r in REPLICAS if layout.pid(r)]
    wait_for(lambda: all(in_rotation(layout, r) for r in running),
             "HAProxy has every running replica in rotation", layout=layout, part="haproxy")


def start(layout: Layout, part: str) -> None:
    """Start ``part`` unless it runs, and wait until it does its job."""
    if layout.pid(part):
        return
    if part == "etcd":
        start_etcd(layout)
    elif part in MEMBERS:
        start_member(layout, part)
        wait_members(layout)
    elif part in REPLICAS:
        start_replica(layout, part)
        wait_replica(layout, part)
        if layout.pid("haproxy"):
            wait_for(lambda: in_rotation(layout, part), f"HAProxy puts {part} in rotation",
                     layout=layout, part="haproxy")
    else:
        start_haproxy(layout)


# --------------------------------------------------------------------------- stopping

def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _postmaster(layout: Layout, member: str) -> int | None:
    try:
        pid = int((layout.dir / member / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return pid if str(layout.dir / member).encode() in cmdline else None


def kill(layout: Layout, part: str) -> list[int]:
    """SIGKILL ``part``; a PostgreSQL member loses its whole host: Patroni, the postmaster
    and every process of it. Returns the pids killed."""
    pids = []
    pid = layout.pid(part)
    if pid:
        pids.append(pid)
    if part in MEMBERS:
        postmaster = _postmaster(layout, part)
        if postmaster:
            pids += [postmaster, *_children(postmaster)]
    for each in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
    for each in pids:
        wait_for(lambda p=each: not _alive(p), f"pid {each} ended", timeout=30)  # type: ignore[misc]
    return pids


def stop(layout: Layout, part: str, timeout: float = 90.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    pid = layout.pid(part)
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not _alive(pid), f"{part} stopped", timeout=timeout)
    except HaError:
        kill(layout, part)
    if part in MEMBERS:  # Patroni stops PostgreSQL; should it have died first, do it
        postmaster = _postmaster(layout, part)
        if postmaster:
            kill(layout, part)


def restart(layout: Layout, part: str) -> None:
    # A replica drains on SIGTERM (/ready 503 until HAProxy moved new calls away), finishes
    # its calls, hands its agents back, and exits; Patroni stops its PostgreSQL cleanly (the
    # primary's leadership goes to the synchronous standby).
    stop(layout, part, timeout=layout.state["drain"] + 60 if part in REPLICAS else 90)
    start(layout, part)


def down(layout: Layout) -> None:
    stop(layout, "haproxy")
    for replica in REPLICAS:  # together: each drains for the same seconds
        pid = layout.pid(replica)
        if pid:
            os.kill(pid, signal.SIGTERM)
    for replica in REPLICAS:
        stop(layout, replica, timeout=layout.state["drain"] + 60)
    leader = primary(layout)
    for member in sorted(MEMBERS, key=lambda m: m == leader):  # the standby first
        stop(layout, member)
    stop(layout, "etcd")


# ---------------------------------------------------------------------------- status

def _metrics(layout: Layout, replica: str) -> dict[str, float]:
    try:
        _, body = _get(f"http://127.0.0.1:{layout.port(replica + '_metrics')}/metrics",
                       timeout=5)
    except OSError:
        return {}
    found = {}
    for line in body.decode(errors="replace").splitlines():
        name, _, value = line.partition(" ")
        if name in ("better_compute_controllers_leader", "better_compute_gateway_sessions"):
            with contextlib.suppress(ValueError):
                found[name] = float(value)
    return found


def status(layout: Layout) -> dict[str, dict[str, Any]]:
    parts: dict[str, dict[str, Any]] = {}
    p = layout.port
    try:
        stats = haproxy_stats(layout) if layout.pid("haproxy") else {}
    except OSError:
        stats = {}
    for part in PARTS:
        pid = layout.pid(part)
        info: dict[str, Any] = {"pid": pid, "running": pid is not None}
        if part == "etcd":
            info["address"] = f"127.0.0.1:{p('etcd')}"
            info["role"] = "Patroni's store" if pid else "down"
        elif part in MEMBERS:
            member = patroni(layout, part) if pid else {}
            info["address"] = f"127.0.0.1:{p(part)} (Patroni REST 127.0.0.1:{p(part + '_rest')})"
            info["role"] = member_role(member)
            info["state"] = member.get("state", "down")
            info["timeline"] = member.get("timeline")
        elif part in REPLICAS:
            info["address"] = (f"api 127.0.0.1:{p(part + '_api')}, gateway "
                               f"127.0.0.1:{p(part + '_gateway')}")
            code, reason = replica_ready(layout, part) if pid else (0, "down")
            metrics = _metrics(layout, part) if pid else {}
            info["ready"] = code == 200
            info["role"] = ("controllers' leader" if metrics.get(
                "better_compute_controllers_leader") else "replica") if pid else "down"
            info["state"] = "ready" if code == 200 else reason
            info["agent_sessions"] = int(metrics.get("better_compute_gateway_sessions", 0))
            info["haproxy"] = {b: stats[(b, part)]["status"] for b in ("api", "gateway")
                               if (b, part) in stats}
        else:
            info["address"] = (f"api {layout.state['api_url']}, gateway "
                               f"{layout.state['gateway_url']}")
            up = {b: sum(1 for r in REPLICAS if stats.get((b, r), {}).get("status", "")
                         .startswith("UP")) for b in ("api", "gateway")}
            info["role"] = "load balancer" if pid else "down"
            info["state"] = (f"{up['api']}/{len(REPLICAS)} replicas in rotation for the API, "
                             f"{up['gateway']}/{len(REPLICAS)} for the gateway") if pid else "down"
        parts[part] = info
    return parts


def _print_status(layout: Layout, parts: dict[str, dict[str, Any]]) -> None:
    rows = [("PART", "PID", "ROLE", "STATE", "ADDRESS")]
    for name, info in parts.items():
        state = info.get("state") or ("running" if info["running"] else "down")
        if name in REPLICAS and info["running"]:
            state += f", {info['agent_sessions']} agent session(s), HAProxy " + ", ".join(
                f"{b} {s}" for b, s in info.get("haproxy", {}).items())
        if name in MEMBERS and info.get("timeline"):
            state += f", timeline {info['timeline']}"
        rows.append((name, str(info["pid"] or "-"), info["role"], state, info["address"]))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4])


def exports(layout: Layout) -> str:
    s = layout.state
    return (f"export BETTER_COMPUTE_URL={s['api_url']}\n"
            f"export BETTER_COMPUTE_CA_FILE={s['ca_file']}\n"
            f"export BETTER_COMPUTE_TOKEN=$(cat {s['token_file']})\n"
            "export BETTER_COMPUTE_TENANT=root\n")


# ------------------------------------------------------------------------------ main

def up(layout: Layout) -> None:
    """Every part that is not running, started, in the order each needs the one before:
    etcd; both members together (Patroni lets one bootstrap and the other copy it); the
    store's init once a primary takes writes (the standby catches up meanwhile); the
    replicas; HAProxy; and, before returning, the standby streaming synchronously."""
    start(layout, "etcd")
    for member in MEMBERS:
        if not layout.pid(member):
            start_member(layout, member)
    wait_for(lambda: primary(layout) is not None, "a PostgreSQL primary", layout=layout,
             part=MEMBERS[0])
    init_store(layout)
    for replica in REPLICAS:
        if not layout.pid(replica):
            start_replica(layout, replica)
    for replica in REPLICAS:
        wait_replica(layout, replica)
    start(layout, "haproxy")
    wait_members(layout)
    (layout.dir / "env").write_text(exports(layout))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/ha", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "restart", "kill", "start"])
    parser.add_argument("parts", nargs="*", help=f"parts: {', '.join(PARTS)}")
    parser.add_argument("--dir", default=os.environ.get("BC_HA_DIR") or str(REPO / ".ha"),
                        help="the state dir (default $BC_HA_DIR, else .ha/ in the checkout)")
    parser.add_argument("--json", action="store_true", help="status as JSON")
    parser.add_argument("--fast", action="store_true",
                        help="up: PostgreSQL without fsync (tests, benchmarks)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="up: a setting for every replica (repeatable)")
    args = parser.parse_args(argv)
    layout = Layout(Path(args.dir))
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: use {', '.join(PARTS)}")
    try:
        if args.command == "up":
            if not layout.exists:
                env = dict(item.split("=", 1) for item in args.env)
                layout.create(args.fast, env)
            up(layout)
            print(f"# the layout is up ({layout.dir}); for the CLI:")
            print(exports(layout), end="")
            print(f"# agents: bcd join --server {layout.state['api_url']}/api/compute …")
            return 0
        if not layout.exists:
            raise HaError(f"no layout in {layout.dir}: run scripts/ha up first")
        if args.command == "status":
            parts = status(layout)
            if args.json:
                print(json.dumps({"state": layout.state, "parts": parts}, indent=2))
            else:
                _print_status(layout, parts)
        elif args.command == "down":
            down(layout)
        elif args.command == "restart":
            for part in args.parts or list(REPLICAS):
                started = time.monotonic()
                restart(layout, part)
                print(f"{part} restarted in {time.monotonic() - started:.1f}s", flush=True)
        elif args.command == "kill":
            for part in args.parts:
                pids = kill(layout, part)
                print(f"{part}: killed {' '.join(map(str, pids)) or 'nothing (not running)'}")
        elif args.command == "start":
            for part in args.parts:
                start(layout, part)
        return 0
    except HaError as exc:
        print(f"scripts/ha: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
