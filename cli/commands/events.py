"""events watch and events list: the event log, one line per event.

``watch`` streams ``GET …/events/watch`` and, when the connection drops or
the server restarts, reconnects with backoff and resumes after the last
sequence it printed (or the last heartbeat's head), so nothing is missed or
printed twice. Without BETTER_COMPUTE_URL it follows the local store.
An ``expired`` answer is final: the log cannot continue from that sequence.

On a terminal each event is one readable line (cli/event_lines.py); piped, or with
``-o json``, one JSON line as the server sent it. ``--subject ID`` keeps one aggregate's
events (filtered here: the position still moves past the others, so a resume skips nothing).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from better_compute.cli import event_lines
from better_compute.cli.context import Context
from better_compute.cli.registry import add_group, add_verb
from better_compute.domain.errors import (
    BetterComputeError,
    InvalidInput,
    Unavailable,
    error_from_code,
)

if TYPE_CHECKING:
    import httpx

    from better_compute.cli.client import StreamClient

RETRY_FIRST = 0.25
RETRY_MAX = 5.0
READ_TIMEOUT = 30.0  # several heartbeats: a silent connection is a dead one
LOCAL_POLL = 0.2


def _types(values: list[str] | None) -> str | None:
    parts = [p.strip() for v in values or [] for p in v.split(",") if p.strip()]
    return ",".join(parts) or None


def _write(out: TextIO, lines: list[str]) -> None:
    out.write("".join(line + "\n" for line in lines))
    out.flush()


Printer = Callable[[str, dict[str, Any]], str | None]


def printer(output: str | None, out: TextIO, env: Mapping[str, str]) -> Printer:
    """What to print for one event: its JSON line, or a readable line on a terminal."""
    readable = output in ("table", "wide") or (output is None and out.isatty())
    colour = readable and event_lines.use_colour(out, env)

    def show(line: str, doc: dict[str, Any]) -> str | None:
        return event_lines.line(doc, colour=colour) if readable else line

    return show


class Resumer:
    """The reader's position across connections: what was printed, what to ask for next."""

    def __init__(self, since: int | None) -> None:
        self.position = since

    def accept(self, doc: dict[str, Any]) -> bool:
        """Record one line of the stream; True when it is a new event to print."""
        if doc.get("heartbeat"):
            head = int(doc.get("head", 0))
            if self.position is None or head > self.position:
                self.position = head
            return False
        sequence = int(doc["sequence"])
        if self.position is not None and sequence <= self.position:
            return False  # already printed before a reconnect
        self.position = sequence
        return True


def _stream_lines(client: StreamClient, resumer: Resumer, types: str | None,
                  connected: Callable[[], None] = lambda: None,
                  audit: Mapping[str, str] | None = None
                  ) -> Iterator[tuple[str, dict[str, Any]]]:
    params: dict[str, Any] = dict(audit or {})
    if resumer.position is not None:
        params["since"] = resumer.position
    if types:
        params["types"] = types
    with client.http.stream("GET", "/events/watch", params=params) as response:
        if response.status_code != 200:
            response.read()
            _raise_http_error(client.base, response)
        connected()
        for line in response.iter_lines():
            if not line.strip():
                continue
            doc = json.loads(line)
            if isinstance(doc, dict) and "error" in doc:
                error = doc["error"]
                raise error_from_code(str(error.get("code")), str(error.get("message")),
                                      error.get("data"))
            yield line, doc


def _raise_http_error(base: str, response: httpx.Response) -> None:
    if response.status_code == 404:
        raise Unavailable(
            f"{base} has no /events/watch route: page through the events with "
            "`better-compute events list` instead"
        )
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise Unavailable(f"{base}/events/watch answered HTTP {response.status_code}") from None
    raise error_from_code(str(error.get("code")), str(error.get("message")))


_FINAL = ("expired", "invalid_input", "unauthenticated", "permission_denied", "not_found",
          "not_initialized")


def watch_http(env: Mapping[str, str], since: int | None, types: str | None,
               out: TextIO, err: TextIO, show: Printer,
               audit: Mapping[str, str] | None = None,
               on_connect: Callable[[], None] | None = None) -> None:
    """Follow the stream over HTTP; ``on_connect``, when given, runs each time the stream is
    (re)established instead of the "following" line (``list --watch`` lists then)."""
    import random

    from better_compute.cli.client import StreamClient, connection_error, httpx_module

    httpx = httpx_module()
    url = env["BETTER_COMPUTE_URL"].strip()
    token = env.get("BETTER_COMPUTE_TOKEN", "").strip() or None
    client = StreamClient(url, token, env, timeout=READ_TIMEOUT)
    resumer = Resumer(since)
    delay = RETRY_FIRST

    ever_connected: list[bool] = []

    def connected() -> None:
        ever_connected.append(True)
        if on_connect is not None:
            on_connect()
            return
        where = (f"after sequence {resumer.position}" if resumer.position is not None
                 else "from now on")
        print(f"events watch: following {client.base}/events/watch {where}", file=err,
              flush=True)

    try:
        while True:
            try:
                for line, doc in _stream_lines(client, resumer, types, connected, audit):
                    delay = RETRY_FIRST
                    if resumer.accept(doc) and (shown := show(line, doc)) is not None:
                        _write(out, [shown])
                reason = "the server ended the stream"
            except BetterComputeError as exc:
                if exc.code in _FINAL:
                    raise
                reason = str(exc)
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if not ever_connected:  # never connected: a setting may be wrong
                    closed = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError |
                                        httpx.ConnectError)
                    error = connection_error(client.base, exc, closed)
                    if isinstance(error, InvalidInput):
                        raise error from None
            pause = delay * (0.75 + random.random() / 2)
            where = f"after sequence {resumer.position}" if resumer.position is not None else "now"
            print(f"events watch: {reason}; reconnecting in {pause:.1f}s to resume {where}",
                  file=err, flush=True)
            time.sleep(pause)
            delay = min(delay * 2, RETRY_MAX)
    finally:
        client.close()


def watch_local(env: Mapping[str, str], since: int | None, types: str | None,
                out: TextIO, show: Printer, audit: Mapping[str, str] | None = None,
                on_connect: Callable[[], None] | None = None) -> None:
    """No server: follow the local store directly (as the local operator); ``on_connect``
    runs once the position to follow from is known."""
    from better_compute.api.runtime import Runtime
    from better_compute.api.store.eventlog import AuditFilter, EventLog, filter_for
    from better_compute.domain.access import LOCAL_OPERATOR

    runtime = Runtime.open(env)
    try:
        runtime.service.pki()  # a store `init` never ran on: not_initialized
        token = env.get("BETTER_COMPUTE_TOKEN", "").strip()
        principal = runtime.service.authenticate(token) if token else LOCAL_OPERATOR
        log = EventLog(runtime.store)
        a = dict(audit or {})
        flt = filter_for(principal, types, audit=AuditFilter.parse(
            a.get("actor"), a.get("subject"), a.get("from"), a.get("to"),
            runtime.service.clock()))
        position = log.head() if since is None else since
        log.check_position(position)
        if on_connect is not None:
            on_connect()
        while True:
            entries, read_to = log.scan(flt, position)
            lines = [shown for e in entries
                     if (shown := show(e.line.decode(), json.loads(e.line))) is not None]
            if lines:
                _write(out, lines)
            if read_to == position:
                time.sleep(LOCAL_POLL)
            position = read_to
    finally:
        runtime.close()


def _audit(a: argparse.Namespace) -> dict[str, str]:
    """--actor, --subject, --from, --to as the API takes them (only those given)."""
    given = {"actor": a.actor, "subject": a.subject, "from": a.from_time, "to": a.to_time}
    return {k: v for k, v in given.items() if v is not None}


def _check_audit(audit: Mapping[str, str]) -> None:
    """Refuse a bad --from/--to here, before connecting (the server checks them again)."""
    from datetime import UTC, datetime

    from better_compute.api.store.eventlog import AuditFilter

    AuditFilter.parse(audit.get("actor"), audit.get("subject"), audit.get("from"),
                      audit.get("to"), datetime.now(UTC))


def events_watch(ctx: Context, a: argparse.Namespace) -> int:
    types = _types(a.types)
    if types:
        from better_compute.domain.events import compile_type_filter

        compile_type_filter(types.split(","))  # a bad glob is refused before connecting
    audit = _audit(a)
    _check_audit(audit)
    since = a.since
    if since is None and "from" in audit:
        since = 0  # --from names a time in the past: read the log from its start, by time
    from better_compute.cli.signals import interruptible

    show = printer(ctx.output, sys.stdout, ctx.env)
    try:
        with interruptible():
            if ctx.env.get("BETTER_COMPUTE_URL", "").strip():
                watch_http(ctx.env, since, types, sys.stdout, sys.stderr, show, audit)
            else:
                watch_local(ctx.env, since, types, sys.stdout, show, audit)
    except BrokenPipeError:  # the reader went away (| head): a normal end
        return 0
    return 0


def events_list(ctx: Context, a: argparse.Namespace) -> int:
    if a.limit is not None and a.limit < 1:
        raise InvalidInput(f"--limit {a.limit} must be at least 1")
    import msgspec

    types = _types(a.types)
    audit = _audit(a)
    show = printer(ctx.output, sys.stdout, ctx.env)
    since = a.since
    printed = 0
    while a.limit is None or printed < a.limit:
        want = 1000 if a.limit is None else min(1000, a.limit - printed)
        page = ctx.call("events.list", since=since, types=types, limit=want, **audit)
        lines = [shown for e in page["events"]
                 if (shown := show(msgspec.json.encode(e).decode(), e)) is not None]
        if a.limit is not None:
            lines = lines[:a.limit - printed]
        if lines:
            _write(sys.stdout, lines)
        printed += len(lines)
        since = page["next"]
        if since >= page["head"]:
            break
    return 0


def _audit_flags(p: Any) -> None:
    p.add_argument("--actor", metavar="ACTOR",
                   help="only events this actor caused: a token id (tok_…), a node (node_…), a "
                   "join token (jt_…), controller:nodes|reservations|tokens, or local")
    p.add_argument("--subject", metavar="ID",
                   help="only events about this object: the event's subject (rsv_…, node_…, "
                   "tok_…, pool_…, a tenant id)")
    p.add_argument("--from", dest="from_time", metavar="TIME",
                   help="only events at or after TIME: RFC 3339, a date (midnight UTC), "
                   "now-DURATION (that long ago, e.g. now-24h) or now")
    p.add_argument("--to", dest="to_time", metavar="TIME",
                   help="only events before TIME (same forms as --from)")


def _format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", "-o", choices=["table", "json"], default=argparse.SUPPRESS,
                   help="table: one readable line per event (default on a terminal); json: the "
                   "server's JSON lines (default when piped)")


def register(sub: Any) -> None:
    g = add_group(sub, "events", "The event log: one line per event, by sequence.",
                  examples=["better-compute events watch --types 'node.*,reservation.*'",
                            "better-compute events list --since 0 --limit 20"])
    p = add_verb(g, "watch", events_watch,
                 "Follow the events live; reconnects and resumes after the last sequence printed. "
                 "A readable line per event on a terminal, JSON lines when piped or with -o json.",
                 output=False,
                 examples=["better-compute events watch --types 'node.*,reservation.*'",
                           "better-compute events watch --subject $RSV",
                           "better-compute events watch --since 120 -o json | jq .type",
                           "better-compute events watch --actor tok_…",
                           "better-compute events watch --from now-1h --subject node_…"])
    _format_flag(p)
    p.add_argument("--types", action="append", metavar="GLOB,GLOB",
                   help="only these event types, e.g. 'node.*,reservation.*'")
    p.add_argument("--since", type=int, metavar="SEQUENCE",
                   help="start after this sequence (default: only events from now on; with "
                   "--from, the start of the log)")
    _audit_flags(p)
    p = add_verb(g, "list", events_list,
                 "Print the events after --since, oldest first, the same lines as watch.",
                 output=False,
                 examples=["better-compute events list --since 0 --limit 20",
                           "better-compute events list --types 'reservation.*' --subject $RSV",
                           "better-compute events list --actor tok_… --from 2026-11-01 --to 2026-12-01",
                           "better-compute events list --from now-24h --actor controller:reservations"])
    _format_flag(p)
    p.add_argument("--types", action="append", metavar="GLOB,GLOB",
                   help="only these event types, e.g. 'node.*,reservation.*'")
    p.add_argument("--since", type=int, default=0, metavar="SEQUENCE",
                   help="start after this sequence (default: 0, the whole log)")
    p.add_argument("--limit", type=int, metavar="K", help="print at most K events")
    _audit_flags(p)
