"""The traffic of benchmarks/watch_etcd.py: bare-socket watchers and the writers, for
better-compute's /watch and etcd's v3 JSON gateway alike.

Every write carries its client's send time (microseconds since the epoch, ``time.time()``
just before the request is sent): in a ``sites.create``'s name (``t<µs>``) for
better-compute, in the put's value for etcd. A watcher's latency is its receive time minus
that stamp, so both sides measure the same thing: the writer's send to a watcher's receive.

The watchers run in their own process (``python -m better_compute.benchmarks.watch_etcd
--_watchers``, uvloop, one raw HTTP/1.1 protocol per stream that undoes the chunked framing
itself); it prints ``ready`` once every stream is open, then, after ``stop`` on its standard
input, one JSON line of counts and latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import sys
import time
from collections.abc import Callable
from typing import cast

from better_compute.benchmarks.watch_traffic import pct

ETCD_PREFIX = b"bench/"
BC_WATCH = "/api/compute/events/watch"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def watch_request(kind: str, host: str, port: int, token: str) -> bytes:
    """The raw request that opens one stream: better-compute's /watch or etcd's /v3/watch
    of every key under ``bench/``."""
    if kind == "etcd":
        end = ETCD_PREFIX[:-1] + bytes([ETCD_PREFIX[-1] + 1])
        body = json.dumps({"create_request": {"key": b64(ETCD_PREFIX),
                                              "range_end": b64(end)}}).encode()
        return (f"POST /v3/watch HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                ).encode() + body
    return (f"GET {BC_WATCH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\n\r\n").encode()


# -------------------------------------------------------------- watcher process

def _bc_stamps(line: bytes) -> tuple[bool, list[int]]:
    """(a heartbeat, the send stamps) of one /watch line."""
    if line.startswith(b'{"heartbeat"'):
        return True, []
    at = line.find(b'"name":"t')
    if at < 0:
        return False, []
    at += 9
    return False, [int(line[at:line.index(b'"', at)])]


def _etcd_stamps(line: bytes) -> tuple[bool, list[int]]:
    """(the watch was created, the send stamps) of one etcd watch message."""
    if b'"created":true' in line:
        return True, []
    stamps, at = [], line.find(b'"value":"')
    while at >= 0:
        at += 9
        end = line.index(b'"', at)
        stamps.append(int(base64.b64decode(line[at:end])))
        at = line.find(b'"value":"', end)
    return False, stamps


class _Watcher(asyncio.Protocol):
    """One raw HTTP/1.1 streaming response: the status line and headers skipped, the chunked
    framing undone, each newline-ended line handed to ``parse``; each ``data_received``
    stamps its arrival time once."""

    def __init__(self, request: bytes, parse: Callable[[bytes], tuple[bool, list[int]]],
                 latencies: list[float]) -> None:
        self.request, self.parse, self.latencies = request, parse, latencies
        self.ready = asyncio.Event()
        self.count = 0
        self.raw = b""  # undecoded bytes: headers, or a partial chunk-size line
        self.headers_done = False
        self.need = 0  # bytes of the current chunk's data still to come
        self.crlf = 0  # bytes of the CRLF after the current chunk still to come
        self.text = b""  # decoded body not yet ended by a newline
        self.error = ""

    def itself(self) -> _Watcher:
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now_us = time.time() * 1e6
        buf, pos = self.raw + data, 0
        if not self.headers_done:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.raw = buf
                return
            if not buf.startswith(b"HTTP/1.1 200"):
                self.error = buf[:end].decode(errors="replace")
                self.ready.set()
                return
            self.headers_done, pos = True, end + 4
        body: list[bytes] = []
        while pos < len(buf):
            if self.need:
                take = min(self.need, len(buf) - pos)
                body.append(buf[pos:pos + take])
                self.need -= take
                pos += take
                if not self.need:
                    self.crlf = 2
            elif self.crlf:
                take = min(self.crlf, len(buf) - pos)
                self.crlf -= take
                pos += take
            else:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                self.need = int(buf[pos:eol].split(b";")[0], 16)
                pos = eol + 2
                if not self.need:  # the last chunk: the stream ended
                    self.crlf = 2
        self.raw = buf[pos:]
        *lines, self.text = (self.text + b"".join(body)).split(b"\n")
        for line in lines:
            ready, stamps = self.parse(line)
            if ready:
                self.ready.set()
            for stamp in stamps:
                self.count += 1
                self.latencies.append((now_us - stamp) / 1e6)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.is_set():
            self.error = self.error or f"connection lost: {exc}"
            self.ready.set()


async def watchers_main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    request = watch_request(args.kind, args.host, args.port, args.token or "")
    parse = _etcd_stamps if args.kind == "etcd" else _bc_stamps
    latencies: list[float] = []
    watchers: list[_Watcher] = []
    for _ in range(args.n):
        watcher = _Watcher(request, parse, latencies)
        await loop.create_connection(watcher.itself, args.host, args.port)
        watchers.append(watcher)
    # Bounded: a server that never answers ends this process, and the benchmark with it.
    await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in watchers)), 60)
    errors = [w.error for w in watchers if w.error]
    if errors:
        raise SystemExit(f"{len(errors)} of {args.n} streams failed, e.g. {errors[0]}")
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for watcher in watchers:
        watcher.transport.close()
    cpu = os.times()
    print(json.dumps({"counts": [w.count for w in watchers],
                      "p50": pct(latencies, 0.50), "p99": pct(latencies, 0.99),
                      "max": max(latencies) if latencies else float("nan"),
                      "cpu": cpu.user + cpu.system}), flush=True)


# ------------------------------------------------------------------ the writers

Write = Callable[[int], str | None]  # write(i) -> a failure, or None


def writer(kind: str, host: str, port: int, token: str) -> tuple[Write, Callable[[], None]]:
    """One kept-alive ``http.client`` connection (a lean client, so the figures are the
    servers'): ``sites.create`` through better-compute's JSON-RPC, or etcd's
    ``POST /v3/kv/put``; each stamps its send time into what it writes."""
    conn = http.client.HTTPConnection(host, port)
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}

    def write_bc(i: int) -> str | None:
        stamp = int(time.time() * 1e6)
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "sites.create",
                           "params": {"kind": "shared", "region": "eu-1", "name": f"t{stamp}"}})
        conn.request("POST", "/api/compute/rpc", body, headers)
        answer = json.loads(conn.getresponse().read())
        return str(answer["error"]) if "error" in answer else None

    def write_etcd(i: int) -> str | None:
        stamp = int(time.time() * 1e6)
        body = json.dumps({"key": b64(ETCD_PREFIX + str(i).encode()),
                           "value": b64(str(stamp).encode())})
        conn.request("POST", "/v3/kv/put", body, {"content-type": "application/json"})
        response = conn.getresponse()
        answer = response.read()
        return None if response.status == 200 else f"{response.status} {answer[:200]!r}"

    return (write_etcd if kind == "etcd" else write_bc), conn.close
