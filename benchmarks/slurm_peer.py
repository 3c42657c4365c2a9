"""Slurm beside better-compute in the same window: ``benchmarks.reservations --peer slurm``.

    .venv/bin/python -m better_compute.benchmarks.reservations --peer slurm
        [--backend sqlite|postgres|both] [--clients 1,8,16] [--rounds 3] [--seconds 5]
        [--slurm-nodes 1000] [--slurm-client session|exec] [--slurm-reserve corecnt=1] …

The peer an operator would otherwise use to hand out slices of a fleet: Slurm's
``scontrol create reservation`` (Debian's ``slurm-wlm``, with ``munge``). Installed with
apt-get when ``slurmctld``, ``scontrol`` or ``munged`` is missing (as root; otherwise the
command says what to install). Set up unprivileged in a temp dir (as ``nobody`` when run as
root): a munge key and ``munged`` on a socket of the temp dir, a ``slurm.conf`` of
``--slurm-nodes`` nodes of 64 cores, and ``slurmctld`` in the foreground. No ``slurmd``: the
nodes are ``State=CLOUD`` (powered down, available to reserve; the power-save programs are
``/bin/true``), so a reservation is placed and checked against the others as on a live
cluster, without any node agent.

For each client count, rounds alternate in ABBA order between better-compute (N clients
creating 1-GPU, 1-hour reservations through ``serve`` for ``--seconds``, then releasing them:
benchmarks/reservations.py) and Slurm (N clients running ``scontrol create reservation
starttime=now duration=60 users=USER corecnt=1`` for ``--seconds``, the reservation of one
core of one node that the 1-GPU create is the peer of, then ``scontrol delete reservation``
for each). ``--slurm-client session`` (default) keeps one ``scontrol`` per client reading its
commands from stdin, as our clients keep their HTTPS connection; ``exec`` starts an
``scontrol`` per command, as a shell script would. Printed per round and as medians:
creates per second, p50/p99 of one create as its client sees it, the server's CPU per create
(``serve`` and its workers; on PostgreSQL also PostgreSQL's own, when it runs here) against
``slurmctld``'s, and the medians of the per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from better_compute.benchmarks import harness
from better_compute.benchmarks.harness import (
    cpu_seconds,
    cpu_ticks,
    free_port,
    load_average,
    steal_percent,
)

_TOOLS = ("slurmctld", "scontrol", "munged")
_SBIN = ("/usr/sbin", "/usr/bin", "/sbin")


def _which(tool: str) -> str | None:
    return shutil.which(tool) or next((f"{d}/{tool}" for d in _SBIN
                                       if os.access(f"{d}/{tool}", os.X_OK)), None)


def ensure_installed() -> dict[str, str]:
    """The paths of slurmctld, scontrol and munged; installed with apt-get when missing."""
    if any(_which(t) is None for t in _TOOLS):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise SystemExit("--peer slurm needs slurmctld, scontrol and munged: install "
                             "Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)")
        print("  installing slurm-wlm and munge with apt-get", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "slurm-wlm", "munge"], check=True, env=env, stdout=subprocess.DEVNULL)
    found = {t: _which(t) for t in _TOOLS}
    missing = [t for t, path in found.items() if path is None]
    if missing:
        raise SystemExit(f"--peer slurm: {', '.join(missing)} still missing after apt-get")
    return {t: str(path) for t, path in found.items()}


class SlurmCluster:
    """munged and slurmctld in a temp dir, unprivileged, with ``nodes`` cloud nodes."""

    def __init__(self, nodes: int) -> None:
        self.tools = ensure_installed()
        self.tmp = Path(tempfile.mkdtemp(prefix="bc-slurm-"))
        self.processes: list[subprocess.Popen[bytes]] = []
        root = os.geteuid() == 0
        user = pwd.getpwnam("nobody") if root else pwd.getpwuid(os.geteuid())
        self.user = user.pw_name  # slurmctld's SlurmUser
        self.client_user = pwd.getpwuid(os.geteuid()).pw_name  # an admin: root or SlurmUser
        self._as = (["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                     "--clear-groups", "--"] if root else [])
        try:
            self._start(nodes, user.pw_uid, user.pw_gid)
        except BaseException:
            self.close()
            raise

    def _start(self, nodes: int, uid: int, gid: int) -> None:
        munge, state = self.tmp / "munge", self.tmp / "state"
        munge.mkdir(mode=0o711)
        state.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf = self.tmp / "slurm.conf"
        self.conf.write_text(self._config(nodes, munge / "socket", state))
        if os.geteuid() == 0:
            for path in (self.tmp, munge, state, key, self.conf):
                os.chown(path, uid, gid)
            self.tmp.chmod(0o711)
        self.processes.append(subprocess.Popen(
            [*self._as, self.tools["munged"], "--foreground", "--force",
             f"--socket={munge / 'socket'}", f"--key-file={key}", f"--pid-file={munge / 'pid'}",
             f"--log-file={munge / 'log'}", f"--seed-file={munge / 'seed'}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _await(lambda: (munge / "socket").exists(), "munged's socket", 30)
        self.ctld = subprocess.Popen(
            [*self._as, self.tools["slurmctld"], "-D", "-f", str(self.conf)],
            env={**os.environ, "SLURM_CONF": str(self.conf)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.processes.append(self.ctld)
        _await(self._up, "slurmctld answering scontrol ping", 120)

    def _config(self, nodes: int, socket: Path, state: Path) -> str:
        return "\n".join([
            "ClusterName=bcpeer", "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            f"SlurmUser={self.user}", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={socket}", f"StateSaveLocation={state}",
            f"SlurmctldPidFile={self.tmp / 'slurmctld.pid'}",
            f"SlurmctldLogFile={self.tmp / 'slurmctld.log'}", "SlurmctldDebug=error",
            "MailProg=/bin/true", "ProctrackType=proctrack/linuxproc",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "MpiDefault=none", "TaskPlugin=task/none",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "SuspendProgram=/bin/true", "ResumeProgram=/bin/true", "SuspendTime=600",
            "ResumeTimeout=3600",
            f"NodeName=gpu[1-{nodes}] CPUs=64 Boards=1 SocketsPerBoard=2 CoresPerSocket=32 "
            "ThreadsPerCore=1 RealMemory=512000 State=CLOUD",
            "PartitionName=gpu Nodes=ALL Default=YES State=UP MaxTime=INFINITE", ""])

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _up(self) -> bool:
        if self.ctld.poll() is not None:
            log = self.tmp / "slurmctld.log"
            raise SystemExit(f"slurmctld ended (status {self.ctld.returncode}): "
                             f"{log.read_text()[-2000:] if log.exists() else ''}")
        done = subprocess.run([self.tools["scontrol"], "ping"], env=self.env,
                              capture_output=True, text=True)
        return "is UP" in done.stdout

    def cpu(self) -> float:
        return cpu_seconds(self.ctld.pid)

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                harness.stop(process, 30)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _await(check: Any, what: str, timeout: float) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        if time.monotonic() > give_up:
            raise SystemExit(f"--peer slurm: no {what} within {timeout:.0f} s")
        time.sleep(0.1)  # a daemon starting: no event to wait on


class Scontrol:
    """One client: a kept ``scontrol`` reading commands from stdin (``session``), or an
    ``scontrol`` per command (``exec``). ``call`` answers the command's output lines."""

    _END = "version"  # a local command (no RPC) whose line ends each answer in a session

    def __init__(self, cluster: SlurmCluster, mode: str) -> None:
        self.cluster, self.mode = cluster, mode
        self.process: subprocess.Popen[str] | None = None
        if mode == "session":
            self.process = subprocess.Popen(
                [cluster.tools["scontrol"]], env=cluster.env, text=True, bufsize=1,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def call(self, command: str) -> list[str]:
        if self.process is None:
            done = subprocess.run([self.cluster.tools["scontrol"], *command.split()],
                                  env=self.cluster.env, capture_output=True, text=True)
            return (done.stdout + done.stderr).splitlines()
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{command}\n{self._END}\n")
        lines: list[str] = []
        while True:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"scontrol ended: {lines}")
            if line.startswith("slurm"):
                return lines
            if not line.startswith(("scontrol: ", "\x1b")):  # readline's echo of the input
                lines.append(line.rstrip("\n"))

    def close(self) -> None:
        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait()


class SlurmBench:
    """Phases of Slurm reservations, measured as ``reservations.Bench`` measures ours."""

    def __init__(self, cluster: SlurmCluster, mode: str, reserve: str) -> None:
        self.cluster, self.mode = cluster, mode
        self.create = (f"create reservation starttime=now duration=60 "
                       f"users={cluster.client_user} {reserve}")

    def phase(self, clients: int, *, seconds: float | None = None,
              names: list[str] | None = None) -> dict[str, Any]:
        """Creates for ``seconds``, or deletes of ``names``, by ``clients`` clients."""
        sessions = [Scontrol(self.cluster, self.mode) for _ in range(clients)]
        todo = [(names or [])[i::clients] for i in range(clients)]
        out: list[tuple[list[float], list[str], list[str]]] = []
        lock, go = threading.Lock(), threading.Event()
        until = [0.0]

        def run(client: Scontrol, mine: list[str]) -> None:
            lat: list[float] = []
            made: list[str] = []
            errors: list[str] = []
            go.wait()
            while mine if names is not None else time.monotonic() < until[0]:
                command = f"delete reservation {mine.pop()}" if names is not None \
                    else self.create
                started = time.perf_counter()
                lines = client.call(command)
                took = time.perf_counter() - started
                created = [x.split(":", 1)[1].strip() for x in lines
                           if x.startswith("Reservation created:")]
                refused = bool(lines) if names is not None else not created
                if refused:
                    errors.append(" ".join(lines)[:300])
                    continue
                lat.append(took)
                made.extend(created)
            with lock:
                out.append((lat, made, errors))

        threads = [threading.Thread(target=run, args=(s, t)) for s, t in zip(sessions, todo,
                                                                              strict=True)]
        for t in threads:
            t.start()
        cpu0, ticks0, start = self.cluster.cpu(), cpu_ticks(), time.monotonic()
        until[0] = start + (seconds or 0)
        go.set()
        for t in threads:
            t.join()
        elapsed = max(1e-9, time.monotonic() - start)
        cpu, steal = self.cluster.cpu() - cpu0, steal_percent(ticks0, cpu_ticks())
        for s in sessions:
            s.close()
        lat = sorted(x for each in out for x in each[0])
        ops = len(lat)
        return {"ops": ops, "rate": ops / elapsed, "names": [n for e in out for n in e[1]],
                "errors": [e for each in out for e in each[2]],
                "p50": statistics.median(lat) if lat else float("nan"),
                "p99": lat[min(ops - 1, int(ops * 0.99))] if lat else float("nan"),
                "cpu_ms": 1000 * cpu / ops if ops else float("nan"), "cores": cpu / elapsed,
                "load": load_average(), "steal": steal}


def compare_with_slurm(backend: str, args: argparse.Namespace) -> None:
    """``--peer slurm``: our creates and Slurm's alternating round by round (ABBA) in one
    window, each round's figures, their medians, and the medians of the per-round ratios."""
    from better_compute.benchmarks.harness import drop_schema, store_env
    from better_compute.benchmarks.reservations import (
        Bench,
        Server,
        _pg_pid,
        _set_up,
        _warm_up,
    )

    counts = [int(c) for c in args.clients.split(",") if c]
    print(f"{backend} vs Slurm: load average {load_average()} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = store_env(backend, args.pg_url, Path(tmp))
        cluster = None
        server = None
        try:
            tokens, ca_pem, pool = _set_up(env, args.nodes, max(counts), args.quota)
            server = Server(env, ["--workers", str(args.workers)] if args.workers else [],
                            args.code)
            ours = Bench(server, tokens, ca_pem, pool, args.client_procs, 0.0,
                         _pg_pid(backend, args))
            cluster = SlurmCluster(args.slurm_nodes)
            slurm = SlurmBench(cluster, args.slurm_client, args.slurm_reserve)
            print(f"  Slurm: slurmctld pid {cluster.ctld.pid}, {args.slurm_nodes} nodes, "
                  f"scontrol {args.slurm_client}, `{slurm.create}`", flush=True)
            _warm_up(ours, backend)
            slurm.phase(1, names=slurm.phase(1, seconds=1.0)["names"])
            for clients in counts:
                _rounds(backend, args, clients, ours, slurm)
        finally:
            if server is not None:
                server.close()
            if cluster is not None:
                cluster.close()
            drop_schema(env)


def _rounds(backend: str, args: argparse.Namespace, clients: int, ours: Any,
            slurm: SlurmBench) -> None:
    got: dict[str, list[dict[str, Any]]] = {"ours": [], "slurm": []}
    for round_ in range(args.rounds):
        for side in (("ours", "slurm") if round_ % 2 == 0 else ("slurm", "ours")):
            if side == "ours":
                made = ours.creates(clients, seconds=args.seconds)
                ours.releases(clients, made["ids"])
            else:
                made = slurm.phase(clients, seconds=args.seconds)
                gone = slurm.phase(clients, names=made["names"])
                made["errors"] += gone["errors"]
            got[side].append(made)
            _show(backend if side == "ours" else "slurm", clients, round_ + 1, made)
    ratio = {k: statistics.median(o[k] / s[k] for o, s in zip(got["ours"], got["slurm"],
                                                              strict=True))
             for k in ("rate", "p50", "p99", "cpu_ms")}
    for side, rounds in got.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in
               ("rate", "p50", "p99", "cpu_ms", "cores")}
        pg = ""
        if side == "ours" and backend == "postgres" and "pg_cpu_ms" in rounds[0]:
            pg = f" + PostgreSQL {statistics.median(r['pg_cpu_ms'] for r in rounds):.2f}"
        print(f"  {backend if side == 'ours' else 'slurm':<10} {clients:>2} clients, median of "
              f"{len(rounds)}: {med['rate']:7.1f} creates/s  p50 {1000 * med['p50']:6.1f} ms  "
              f"p99 {1000 * med['p99']:6.1f} ms  CPU {med['cpu_ms']:5.2f} ms/create{pg} "
              f"({med['cores']:.2f} cores)", flush=True)
    print(f"  {backend} / slurm {clients:>2} clients (medians of per-round ratios): creates/s "
          f"{ratio['rate']:.2f}x  p50 {ratio['p50']:.2f}x  p99 {ratio['p99']:.2f}x  CPU per "
          f"create {ratio['cpu_ms']:.2f}x (server vs slurmctld)  load {load_average()}",
          flush=True)


def _show(side: str, clients: int, round_: int, r: dict[str, Any]) -> None:
    pg = f" + PostgreSQL {r['pg_cpu_ms']:.2f}" if side == "postgres" and "pg_cpu_ms" in r else ""
    line = (f"    round {round_} {side:<8} {clients:>2} clients: {r['rate']:7.1f} creates/s  "
            f"p50 {1000 * r['p50']:6.1f} ms  p99 {1000 * r['p99']:6.1f} ms  CPU "
            f"{r['cpu_ms']:5.2f} ms/create{pg} ({r['cores']:.2f} cores)  load {r['load']}  "
            f"steal {r['steal']:.0f} %")
    if r["errors"]:
        line += f"\n      {len(r['errors'])} errors, first: {r['errors'][0]}"
    print(line, flush=True)
