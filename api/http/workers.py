"""``serve --workers N``: N processes serve the API on one listening socket (docs/performance.md).

The parent binds the API's socket and starts N worker processes (``python -m
better_compute.api.http.worker_process DOC``, the socket inherited as a file descriptor, DOC the
JSON of its index, the descriptor and the serve options). The kernel hands each new connection to one of
them. Worker 0 also runs what must run once per server: the controllers (still elected
among replicas) and the loopback /metrics listener; the last worker runs the agents'
gateway (with one worker, worker 0 runs both). Each serves the API, /watch (each follows
the store with its own hub, as replicas do) and the console. The gateway is apart from the
controllers because a fleet connecting at once is two kinds of work that each take a core:
the gateway's TLS handshakes and sessions, and the controllers' passes and read models
(docs/decisions.md, "Where the gateway runs").
Correctness never rested on one process: a placement's save is refused when another
process booked the same GPUs or used the same quota (the aggregates), and the placer
then reads again.

The parent prints one ready line once every worker serves (and tells systemd READY=1:
the unit's NotifyAccess=main hears the main process only, so the workers' environment has
no NOTIFY_SOCKET), forwards SIGTERM and SIGINT to them, and if one ends on its own stops
the others and exits with status 1, so a service manager starts the server again (one that
cannot start: with its status, 2 for a bad setting, after its one line on stderr). A
worker dies with its parent (PR_SET_PDEATHSIG), so a parent killed with SIGKILL leaves no
worker serving on. After SIGTERM the workers have ``STOP_TIMEOUT`` seconds together to end;
those left are killed. ``kill -USR1 WORKER_PID`` writes every thread's stack of that worker
to stderr, and once it serves also its event loop's tasks (api/http/introspect.py), for one
that seems stuck.

Metrics: the parent creates an empty directory for this run and names it to the workers in
``PROMETHEUS_MULTIPROC_DIR``; prometheus-client keeps each worker's counters in files
there and a scrape on any worker sums them (api/http/metrics.py). The directory is
removed when the server ends, so a next run never counts a previous run's files. A parent
killed with SIGKILL cannot remove it: the parent holds a lock on the directory's
``owner.lock`` for its life (the kernel lets go of it however the process ends), and each
start removes the directories whose lock nobody holds (``sweep_stale_metrics_dirs``);
never a live server's, nor one without the file (being made, or not ours to judge).

The default number of workers is the cores this process may run on (``default_workers``).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT = 120.0  # seconds a worker has to open the store and serve
STOP_TIMEOUT = 50.0  # seconds the workers have to end after SIGTERM, together
METRICS_PREFIX = "better-compute-metrics-"  # the run's metrics directory, in the temp dir
OWNER_LOCK = "owner.lock"  # in it: locked by the parent for its life


log = logging.getLogger("better_compute.serve")


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity; the machine's where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity on this platform
        return os.cpu_count() or 1


def bind(host: str, port: int) -> socket.socket:
    """The API's listening socket (the workers inherit it)."""
    from better_compute.domain.errors import InvalidInput

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"--listen {host}:{port}: cannot listen there ({exc.strerror}): "
                           "pick a free port") from None
    sock.set_inheritable(True)
    return sock


def listening_socket(fd: int) -> socket.socket:
    """A worker's own object for its parent's listening socket (``bind``), read from the
    descriptor as what it is: a TCP socket. uvicorn's ``Config(fd=...)`` wraps a descriptor
    as a Unix socket, and asyncio then leaves Nagle on for every connection it accepts: an
    answer written in two parts waited ~40 ms for the client's delayed ACK."""
    return socket.socket(fileno=os.dup(fd))


def sweep_stale_metrics_dirs(root: str | None = None) -> list[str]:
    """Remove the metrics directories (of this user, in ``root``, the temp dir by default)
    whose owner lock no process holds: their server ended without removing them."""
    removed = []
    for path in sorted(Path(root or tempfile.gettempdir()).glob(f"{METRICS_PREFIX}*")):
        try:
            info = path.lstat()
            fd = os.open(path / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, or no lock file: not ours to judge
            continue
        try:
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() \
                    or os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its server runs
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        finally:
            os.close(fd)
    return removed


def _metrics_dir() -> tuple[str, int]:
    """A new directory for this run's metrics, and the descriptor holding its owner lock
    (taken before the file has its name, so a sweep never sees it unlocked); stale ones
    removed first."""
    for stale in sweep_stale_metrics_dirs():
        log.warning("removed %s, the metrics directory of a server that ended without "
                    "removing it", stale)
    folder = tempfile.mkdtemp(prefix=METRICS_PREFIX)
    fd = os.open(os.path.join(folder, f".{OWNER_LOCK}"), os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(os.path.join(folder, f".{OWNER_LOCK}"), os.path.join(folder, OWNER_LOCK))
    return folder, fd


def supervise(options: Any, env: dict[str, str] | None, host: str, port: int) -> None:
    """Run ``options.workers`` workers on one socket until a signal or a worker's end."""
    from better_compute.api.wire.daemon import notify
    from better_compute.domain.errors import error_from_code

    sock = bind(host, port)
    base = dict(os.environ if env is None else env)
    notify_env = {k: base.pop(k) for k in ("NOTIFY_SOCKET",) if k in base}
    metrics_dir, owner_lock = _metrics_dir()
    base["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    workers: list[subprocess.Popen[str]] = []
    stopping = {"signal": 0}

    def stop(signum: int, _frame: Any) -> None:
        if signum and not stopping["signal"]:
            notify("STOPPING=1", notify_env)
        stopping["signal"] = signum
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for index in range(options.workers):
            doc = {"fd": sock.fileno(), "index": index, "parent": os.getpid(),
                   "options": dataclasses.asdict(options)}
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "better_compute.api.http.worker_process", json.dumps(doc)],
                env=base, pass_fds=(sock.fileno(),),
                stdout=subprocess.PIPE, text=True))
        first, error = _await_ready(workers)
        if first is None:  # a worker could not start
            stop(0, None)
            _reap(workers)
            if error is not None:  # ours: the CLI says it once, with its exit status
                raise error_from_code(error["code"], error["message"])
            sys.exit(1)  # anything else: the worker's stderr said it
        print(f"{first.rstrip()} ({options.workers} workers)", flush=True)
        notify("READY=1", notify_env)
        while not stopping["signal"]:
            ended = [w for w in workers if w.poll() is not None]
            if ended:
                print(f"better-compute serve: worker pid {ended[0].pid} ended (status "
                      f"{ended[0].returncode}); stopping the others", file=sys.stderr,
                      flush=True)
                stop(0, None)
                _reap(workers)
                sys.exit(1)
            time.sleep(0.2)  # a child's end has no event to wait on across processes here
        _reap(workers)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        os.close(owner_lock)


def _await_ready(workers: list[subprocess.Popen[str]]
                 ) -> tuple[str | None, dict[str, str] | None]:
    """Worker 0's ready line once every worker serves; None when one ended or took too long,
    with the error it reported when it was one of ours (``error {code, message}``): worker
    0's when it has one, as it checks what the others check and more, in the order a single
    process does (so the error is the one ``--workers 1`` would give)."""
    lines: dict[int, str] = {}
    errors: dict[int, dict[str, str]] = {}
    ended: set[int] = set()
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        if errors and (0 in errors or 0 in lines or 0 in ended):
            return None, errors.get(0, next(iter(errors.values())))
        if ended and not errors:
            return None, None
        if len(lines) == len(workers):
            return lines[0], None
        if time.monotonic() > deadline:
            return None, None
        waiting = {w.stdout: i for i, w in enumerate(workers)
                   if w.stdout is not None and i not in lines and i not in errors
                   and i not in ended}
        ready, _, _ = select.select(list(waiting), [], [], 1.0)
        for stream in ready:
            index = waiting[stream]
            line = stream.readline()
            if line.startswith("error "):
                errors[index] = json.loads(line[len("error "):])
            elif not line:
                ended.add(index)
            elif "serving" in line:
                lines[index] = line


def _reap(workers: list[subprocess.Popen[str]]) -> None:
    """Wait for the workers to end, STOP_TIMEOUT seconds for all of them together; then
    SIGKILL those left (within the service unit's TimeoutStopSec, 60 s)."""
    deadline = time.monotonic() + STOP_TIMEOUT
    for w in workers:
        try:
            w.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("worker pid %d did not end within %.0fs of SIGTERM; killing it",
                        w.pid, STOP_TIMEOUT)
            w.kill()
            w.wait()
