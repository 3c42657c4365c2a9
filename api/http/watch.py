"""``GET /api/compute/events/watch``: the event log, live, one JSON line per event.

The process's follower of the log (``WatchHub``, api/http/follower.py) keeps a
window of recent events, rendered once; this module is the HTTP side.

Each stream keeps its own position (the last sequence it has read) and
copies the window's lines after it that its reader may see, at most
``MAX_WRITE_BYTES`` (256 KiB) or 1,000 lines per write, so a stream that is
behind catches up in few large writes and a reader that stops reading pins
at most one write (plus what its socket buffers). A stream that starts older
than the window (``since`` far back) reads the store itself, a page of
``CATCH_UP_PAGE`` events at a time (each write again at most 256 KiB), until
it reaches the window. A stream that has reached the window and then falls
out of it again (its reader reads slower than events arrive, by more than
the window) is ended with a ``fell_behind`` line saying where to resume
(``--since N``, which the CLI does by itself). So a slow reader only slows
itself, writers and other streams never wait for it, and the server holds
at most the window plus one write per stream.

A stream ends with an ``unauthenticated`` line as soon as its token is
revoked (the hub notes every ``token.revoked`` it publishes;
``credential_ended`` in api/http/watch_limits.py is also where a token's expiry will
end its streams).

The stream opens with a heartbeat line and sends another whenever no line
went out for ``BETTER_COMPUTE_WATCH_HEARTBEAT`` seconds (default 5):
``{"heartbeat": true, "head": N}``. ``head`` is the stream's position:
every event up to N that the reader may see has been sent before that line,
so a reader with a narrow ``types`` filter can checkpoint at N. It never
goes backwards. An error after the stream started is one last line
``{"error": {"code": "expired", "message": "..."}}`` before the stream ends.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from better_compute.api.http.follower import WatchHub
from better_compute.api.http.watch_limits import catch_up, credential_ended, fell_behind
from better_compute.api.store.eventlog import AuditFilter, EventFilter, filter_for
from better_compute.api.store.outage import unavailable_on_outage
from better_compute.domain.access import Principal
from better_compute.domain.errors import BetterComputeError, InvalidInput

WATCH_PATH = "/api/compute/events/watch"

AUDIT_PARAMS = ("actor", "subject", "from", "to")  # as events.list takes them

_HTTP_STATUS = {
    "invalid_input": 400, "unauthenticated": 401, "permission_denied": 403,
    "not_found": 404, "expired": 410, "not_initialized": 503, "unavailable": 503,
}


def _heartbeat(position: int) -> bytes:
    return b'{"heartbeat":true,"head":%d}\n' % position


def _error_line(exc: BetterComputeError) -> bytes:
    return msgspec.json.encode({"error": {"code": exc.code, "message": exc.message,
                                          **({"data": exc.data} if exc.data else {})}}) + b"\n"


class TokenCheck:
    """The stream's token, checked again by the same authentication when its end comes.

    An expired token fails ``authenticate`` like a revoked one (api/services/tokens.py),
    so a stream open when its token's lifetime (or rotation grace) ends gets
    the ``unauthenticated`` line and ends.
    """

    def __init__(self, service: Any, secret: str | None, principal: Principal) -> None:
        self.service = service
        self.secret = secret
        self.ends_at = principal.expires_at

    def due(self) -> bool:
        return self.ends_at is not None and self.service.clock() >= self.ends_at

    def check(self) -> None:
        """Raises Unauthenticated once the token no longer authenticates."""
        self.ends_at = self.service.authenticate(self.secret).expires_at


async def stream_events(hub: WatchHub, flt: EventFilter, since: int,
                        limiter: anyio.CapacityLimiter, token: TokenCheck | None = None,
                        principal: Principal | None = None
                        ) -> AsyncIterator[bytes]:
    """The lines of one watcher: events after ``since`` in order, heartbeats, maybe an error."""
    with hub.reading():
        async for chunk in _stream(hub, flt, since, limiter, token, principal):
            yield chunk


async def _stream(hub: WatchHub, flt: EventFilter, since: int, limiter: anyio.CapacityLimiter,
                  token: TokenCheck | None, principal: Principal | None
                  ) -> AsyncIterator[bytes]:
    position = since
    live = False  # has read from the window: falling out of it again ends the stream
    yield _heartbeat(position)
    last_sent = time.monotonic()
    while not hub.stopping:
        ended = credential_ended(hub, principal)
        if ended is not None:
            yield _error_line(ended)
            return
        if token is not None and token.due():
            try:
                await anyio.to_thread.run_sync(token.check, limiter=limiter)
            except BetterComputeError as exc:
                yield _error_line(exc)
                return
        changed = hub.changed  # taken before reading: a publish after this read sets it
        got = hub.chunk(position, flt)
        if got is None and live:
            yield _error_line(fell_behind(hub, position))
            return
        if got is None:  # started older than the window: read the store, a page at a time
            try:
                data, position = await anyio.to_thread.run_sync(
                    catch_up, hub, flt, position, limiter=limiter)
            except BetterComputeError as exc:
                yield _error_line(exc)
                return
        else:
            live = True
            data, position = got
        if data:
            yield data
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= hub.heartbeat:
            yield _heartbeat(position)
            last_sent = time.monotonic()
        if position < hub.head:
            continue  # more to read (events this reader does not see count as read)
        await changed.wait()  # the next publish, or the hub's tick


def _error_response(exc: BetterComputeError) -> Response:
    return JSONResponse({"error": {"code": exc.code, "message": exc.message}},
                        status_code=_HTTP_STATUS.get(exc.code, 400))


def _parse_since(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(
            f"since={text!r} is not a sequence: use the sequence of the last event you read"
        ) from None


async def watch_endpoint(request: Request) -> Response:
    state = request.app.state.bc
    hub: WatchHub = state.extra["watch_hub"]
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    secret = token.strip() if scheme.lower() == "bearer" else None
    service = state.runtime.service

    def admit() -> tuple[EventFilter, int, TokenCheck, Principal]:
        principal: Principal = service.authenticate(secret or None)
        check = TokenCheck(service, secret or None, principal)
        query = request.query_params
        unknown = set(query) - {"since", "types", *AUDIT_PARAMS}
        if unknown:
            raise InvalidInput(
                f"unknown query parameter(s) {', '.join(sorted(unknown))}: /events/watch takes "
                "since=SEQUENCE, types=GLOB,GLOB, actor, subject, from and to"
            )
        audit = AuditFilter.parse(query.get("actor"), query.get("subject"), query.get("from"),
                                  query.get("to"), service.clock())
        flt = filter_for(principal, query.getlist("types"), audit=audit)
        since = _parse_since(request.query_params.get("since"))
        head = hub.log.head()
        if since is None:
            return flt, head, check, principal
        hub.log.check_position(since, head)
        return flt, since, check, principal

    try:
        with unavailable_on_outage():
            flt, since, check, principal = await anyio.to_thread.run_sync(
                admit, limiter=state.limiter)
    except BetterComputeError as exc:
        return _error_response(exc)
    return StreamingResponse(
        request.app.state.metrics.stream(
            stream_events(hub, flt, since, state.limiter, check, principal)),
        media_type="application/x-ndjson",
        headers={"cache-control": "no-store", "x-accel-buffering": "no"},
    )


ROUTES = [Route(WATCH_PATH, watch_endpoint, methods=["GET"])]


@contextlib.asynccontextmanager
async def running_hub(state: Any) -> AsyncIterator[WatchHub]:
    """Run the process's hub for the life of the server (used by the app's lifespan)."""
    hub = WatchHub.for_runtime(state.runtime)
    state.extra["watch_hub"] = hub
    async with anyio.create_task_group() as tg:
        await tg.start(hub.run)
        try:
            yield hub
        finally:
            hub.stop()
            tg.cancel_scope.cancel()


def stop_streams(app: Any) -> Callable[[], None]:
    """A callback that ends every watch stream of ``app`` (the server calls it on shutdown)."""

    def stop() -> None:
        state = getattr(app.state, "bc", None)
        hub = state.extra.get("watch_hub") if state is not None else None
        if hub is not None:
            hub.stop()

    return stop
