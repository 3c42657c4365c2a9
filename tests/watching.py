"""Helpers of the event-log tests: a /watch reader, a CLI watcher, bulk writers, and a /watch
stream through the ASGI app in-process (``Stream``, ``serving_app``).

Readers run in a thread and hand lines over a queue, so a test waits for the
line it needs with a deadline instead of sleeping.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import httpx

from better_compute.api.http.app import build_app
from better_compute.api.http.watch import WATCH_PATH
from better_compute.api.runtime import Runtime
from better_compute.domain.site import Site
from tests.support import CLI, Server


def watch_env(env: Mapping[str, str], **extra: str) -> dict[str, str]:
    """A store's environment with quick heartbeats, for servers under test."""
    return {**env, "BETTER_COMPUTE_WATCH_HEARTBEAT": "0.3", **extra}


def write_sites(runtime: Runtime, count: int, *, per_save: int = 50, region: str = "eu-1"
                ) -> list[int]:
    """``count`` site.created events, ``per_save`` per atomic save; returns their sequences."""
    sequences: list[int] = []
    batch: list[Site] = []
    for i in range(count):
        batch.append(Site(tenant_id="root", kind="shared", region=region, name=f"s{i}",
                          key=None, fingerprint="-"))
        if len(batch) == per_save or i == count - 1:
            recordings = runtime.store.save(*batch, actor="local")
            sequences.extend(r.notification.id for r in recordings)
            batch = []
    return sequences


def log_sequences(runtime: Runtime, after: int = 0) -> list[int]:
    out: list[int] = []
    while True:
        page = runtime.store.recorder.select_notifications(start=after, limit=1000,
                                                           inclusive_of_start=False)
        if not page:
            return out
        out.extend(n.id for n in page)
        after = page[-1].id


class Reader:
    """One /watch stream read in a thread; ``get`` waits for the next JSON line."""

    def __init__(self, server: Server, token: str, ca_file: Path | str, **params: Any) -> None:
        self.lines: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()
        self.status: int | None = None
        self.ready = threading.Event()
        self._client = httpx.Client(verify=ssl.create_default_context(cafile=str(ca_file)) if server.url.startswith("https") else False,
                                    timeout=httpx.Timeout(30.0, connect=10.0))
        self._url = f"{server.url}/api/compute/events/watch"
        self._headers = {"authorization": f"Bearer {token}"}
        self._params = {k: v for k, v in params.items() if v is not None}
        self._closed = False
        self._socket: Any = None  # the stream's socket, shut down by close
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self.ready.wait(30):
            raise AssertionError("the watch stream did not answer within 30 s")

    def _run(self) -> None:
        try:
            with self._client.stream("GET", self._url, params=self._params,
                                     headers=self._headers) as response:
                self.status = response.status_code
                self._socket = response.extensions["network_stream"].get_extra_info("socket")
                self.ready.set()
                for line in response.iter_lines():
                    if line.strip():
                        self.lines.put(json.loads(line))
        except BaseException as exc:  # handed to the test thread
            if not self._closed:
                self.lines.put(exc)
        finally:
            self.ready.set()
            self.lines.put(None)

    def get(self, timeout: float = 20.0) -> dict[str, Any]:
        item = self.lines.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        if item is None:
            raise AssertionError("the watch stream ended")
        return item

    def events(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The next ``count`` events (heartbeats skipped)."""
        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        while len(out) < count:
            line = self.get(max(0.01, deadline - time.monotonic()))
            if "sequence" in line:
                out.append(line)
        return out

    def until(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20.0
              ) -> list[dict[str, Any]]:
        """Every line up to and including the first one ``predicate`` accepts."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while True:
            line = self.get(max(0.01, deadline - time.monotonic()))
            seen.append(line)
            if predicate(line):
                return seen

    def close(self) -> None:
        """Stop the stream and its thread, then close. The thread sits in OpenSSL's read,
        which holds the socket's descriptor number: closing the socket under it let its
        next read take bytes of whichever connection got that number next. A shutdown
        wakes the read and keeps the number until the thread has let go."""
        self._closed = True
        if self._socket is not None:
            with contextlib.suppress(OSError):  # the server may have closed it already
                self._socket.shutdown(socket.SHUT_RDWR)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the watch reader's thread did not stop"
        self._client.close()


class CliWatcher:
    """``better-compute events watch`` as a real process; stdout lines over a queue."""

    def __init__(self, env: Mapping[str, str], *args: str) -> None:
        self.process = subprocess.Popen([CLI, "events", "watch", *args], env=dict(env),
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump_out, daemon=True).start()
        self._err_thread = threading.Thread(target=self._pump_err, daemon=True)
        self._err_thread.start()

    def _pump_out(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.stderr.append(line)

    def events(self, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        while len(out) < count:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"got {len(out)} of {count} events; stderr: {''.join(self.stderr)[-2000:]}"
                ) from None
            if line is None:
                raise AssertionError(f"events watch exited: {''.join(self.stderr)[-2000:]}")
            out.append(json.loads(line))
        return out

    def until(self, event_type: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The next events up to and including the first of ``event_type``."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while not seen or seen[-1]["type"] != event_type:
            seen += self.events(1, timeout=max(0.01, deadline - time.monotonic()))
        return seen

    def no_more_events(self, within: float) -> bool:
        """True when no line arrives within ``within`` seconds (checks for duplicates)."""
        try:
            line = self.lines.get(timeout=within)
        except queue.Empty:
            return True
        return line is None

    def stop(self, sig: int) -> tuple[int, str]:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=30)
        self._err_thread.join(timeout=10)
        return code, "".join(self.stderr)


class Stream:
    """One GET /watch through the ASGI app; ``reading`` False stalls the reader's socket."""

    def __init__(self, token: str, query: str = "") -> None:
        self.token = token
        self.query = query
        self.lines: list[dict[str, Any]] = []
        self.reading = anyio.Event()
        self.reading.set()
        self.status = 0
        self.ended = anyio.Event()
        self.stalled = anyio.Event()  # set once a write waits for a reader that does not read
        self._buffer = b""

    async def run(self, app: Any) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "https", "path": WATCH_PATH,
                 "raw_path": WATCH_PATH.encode(), "query_string": self.query.encode(),
                 "root_path": "", "client": ("127.0.0.1", 5000),
                 "server": ("testserver", 443), "state": {},
                 "headers": [(b"authorization", f"Bearer {self.token}".encode())]}
        disconnect = anyio.Event()

        async def receive() -> dict[str, Any]:
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if not self.reading.is_set():
                self.stalled.set()
            await self.reading.wait()  # a reader that does not read: the write never ends
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body":
                self._buffer += message.get("body", b"")
                *done, self._buffer = self._buffer.split(b"\n")
                self.lines.extend(json.loads(line) for line in done if line)
                if not message.get("more_body", False):
                    self.ended.set()

        try:
            await app(scope, receive, send)
        finally:
            self.ended.set()
            disconnect.set()

    async def wait_for(self, predicate: Any, timeout: float = 20) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while True:
                for line in self.lines:
                    if predicate(line):
                        return line
                await anyio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving_app(runtime: Runtime) -> AsyncIterator[Any]:
    """The real ASGI app of ``runtime`` with its lifespan (the watch hub running)."""
    app = build_app(runtime)
    async with app.router.lifespan_context(app):
        yield app
