"""The watch benchmark's traffic (benchmarks/watch.py): the watchers that read /watch, and
the writers that commit the events they wait for.

The watchers run in their own process (``python -m better_compute.benchmarks.watch
--_watchers``, asyncio, raw HTTP/1.1 reads), so their work does not delay the writers; each
prints ``ready CPU`` once its streams are open, then one JSON line of counts and latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

# ---------------------------------------------------------------- percentiles

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -------------------------------------------------------------- watcher process

class _Watcher(asyncio.Protocol):
    """One raw HTTP/1.1 stream, parsed as little as possible so the reader stays cheap.

    A protocol (no stream reader, no task per read): each ``data_received``
    stamps its arrival time once and counts the event lines in it. The
    server sends whole lines per chunk, so splitting on newlines and keeping
    the lines that start with ``{`` skips the chunk framing.
    """

    def __init__(self, request: bytes, want: int | None, latencies: list[float],
                 done: asyncio.Future[None]) -> None:
        self.request, self.want, self.latencies, self.done = request, want, latencies, done
        self.ready = asyncio.Event()
        self.count = 0
        self.buffer = b""

    def itself(self) -> _Watcher:
        """The protocol factory ``create_connection`` takes: this one watcher."""
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        marker = b'"time":"'
        for line in lines:
            if line.startswith(b'{"sequence"'):
                self.count += 1
                if self.want is None:
                    at = line.index(marker) + len(marker)
                    stamp = line[at:line.index(b'"', at)].decode()
                    self.latencies.append(now - datetime.fromisoformat(stamp).timestamp())
            elif line.startswith(b'{"heartbeat"'):
                self.ready.set()
        if self.want is not None and self.count >= self.want:
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        self.transport.close()


async def watchers_main(args: argparse.Namespace) -> None:
    from urllib.parse import urlparse

    parsed = urlparse(f"{args.url}/api/compute/events/watch")
    query = "" if args.since is None else f"?since={args.since}"
    request = (f"GET {parsed.path}{query} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
               f"Authorization: Bearer {args.token}\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    want = args.want if args.want > 0 else None
    latencies: list[float] = []
    watchers: list[_Watcher] = []
    started = time.perf_counter()
    host, port = parsed.hostname, parsed.port
    if host is None or port is None:
        raise SystemExit(f"--url {args.url}: give the host and the port, http://HOST:PORT")
    for _ in range(args.n):
        watcher = _Watcher(request, want, latencies, loop.create_future())
        await loop.create_connection(watcher.itself, host, port)
        watchers.append(watcher)
    if want is None:
        # Bounded: a server that never answers ends this process, and the benchmark with it.
        await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in watchers)), 60)
        cpu = os.times()
        print(f"ready {cpu.user + cpu.system}", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
    else:
        await asyncio.gather(*(w.done for w in watchers))
    elapsed = time.perf_counter() - started
    for watcher in watchers:
        watcher.transport.close()
    cpu = os.times()
    print(json.dumps({"elapsed": elapsed, "counts": [w.count for w in watchers],
                      "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99),
                      "max": max(latencies) if latencies else float("nan"),
                      "cpu": cpu.user + cpu.system}), flush=True)


# ------------------------------------------------------------------ the writers

Writer = tuple[Any, Any]  # (write(i) -> failure or None, close())


def paced_writes(make_writer: Callable[[], Writer], total: int, rate: float, threads: int
                 ) -> tuple[float, list[float], list[str]]:
    """``total`` writes, the i-th due at start + i/rate, from ``threads`` client threads, each
    with its own writer from ``make_writer`` (many clients, so that one slow answer does not
    hold the schedule back): the start, each write's own time in seconds, the failures."""
    import threading

    start = time.perf_counter() + 0.05
    counter = iter(range(total))
    lock = threading.Lock()
    failures: list[str] = []
    times: list[float] = []

    def run() -> None:
        write, close = make_writer()
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                sent = time.perf_counter()
                failure = write(i)
                times.append(time.perf_counter() - sent)
                if failure:
                    failures.append(failure)
        finally:
            close()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    return start, times, failures


def rpc_writer(url: str, token: str) -> Writer:
    """``sites.create`` over a kept-alive http.client connection: a lean client, so the
    figures are the server's (httpx costs several times more CPU per call)."""
    import http.client
    from urllib.parse import urlparse

    parsed = urlparse(url)
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def write(i: int) -> str | None:
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "sites.create",
                           "params": {"kind": "shared", "region": "eu-1"}})
        conn.request("POST", "/api/compute/rpc", body, headers)
        answer = json.loads(conn.getresponse().read())
        return str(answer["error"]) if "error" in answer else None

    return write, conn.close


def store_writer(runtime: Any) -> Writer:
    """One site saved straight into the store per write (one event per commit)."""
    from better_compute.domain.site import Site

    def write(i: int) -> str | None:
        runtime.store.save(Site(tenant_id="root", kind="shared", region="eu-1", name=f"w{i}",
                                key=None, fingerprint="-"), actor="local")
        return None

    return write, lambda: None
