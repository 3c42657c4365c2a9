"""reserve's waiting: create with retries, then wait for ``active`` or a final state.

A reservation is *settled* when it is ``active``, in a final state (``released``,
``cancelled``, ``failed``, …), or placed to start later (nothing binds before its start).
While it is ``placed`` (starting now), ``binding`` or ``queued`` the CLI polls
``reservations.get`` until the deadline, with a spinner on standard error when that is a
terminal. Without BETTER_COMPUTE_URL (in-process, no server) nothing binds holds, so it
returns once placed.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

from better_compute.cli import exit_codes
from better_compute.cli.context import Caller, Waiter
from better_compute.cli.signals import interruptible
from better_compute.domain.errors import Unavailable

WAITING = ("placed", "binding", "queued")
POLL_FIRST, POLL_MAX = 0.2, 1.0
_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def create_with_retries(ctx: Caller, params: dict[str, Any], wait: float) -> Any:
    """reservations.create, again with the same key while the server is unreachable."""
    deadline = time.monotonic() + wait
    delay = 0.25
    while True:
        try:
            return ctx.call("reservations.create", **params)
        except Unavailable:
            # The same key makes the retry safe: at most one reservation is ever booked.
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def _starts_later(doc: dict[str, Any]) -> bool:
    try:
        start = datetime.fromisoformat(str(doc.get("start")).replace("Z", "+00:00"))
    except ValueError:
        return False
    return start > datetime.now(UTC)


def settled(doc: dict[str, Any]) -> bool:
    state = doc.get("state")
    return state not in WAITING or (state == "placed" and _starts_later(doc))


class _Spinner:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.on = bool(getattr(stream, "isatty", lambda: False)())
        self.frame = 0

    def show(self, text: str) -> None:
        if self.on:
            self.frame += 1
            self.stream.write(f"\r\x1b[K{_FRAMES[self.frame % len(_FRAMES)]} {text}")
            self.stream.flush()

    def clear(self) -> None:
        if self.on and self.frame:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def wait_until_settled(ctx: Waiter, doc: dict[str, Any], wait: float) -> tuple[dict[str, Any], int]:
    """The reservation once settled (or at the deadline), and the exit status to end with."""
    if wait <= 0 or settled(doc) or not ctx.env.get("BETTER_COMPUTE_URL", "").strip():
        return doc, exit_codes.OK
    with interruptible():
        doc = _poll(ctx, doc, wait)
    if not settled(doc):
        print(f"{doc['id']} is still {doc.get('state')} after {wait:g}s (--wait); follow it "
              f"with `better-compute reservations get {doc['id']} --query state`",
              file=sys.stderr)
    elif doc.get("state") == "failed":
        failure = doc.get("failure") or {}
        print(f"error [reservation_failed]: {doc['id']} failed: "
              f"{failure.get('message') or failure.get('reason') or 'see its events'}",
              file=sys.stderr)
        return doc, exit_codes.ERROR
    return doc, exit_codes.OK


def _poll(ctx: Waiter, doc: dict[str, Any], wait: float) -> dict[str, Any]:
    started = time.monotonic()
    deadline = started + wait
    spinner = _Spinner(sys.stderr)
    poll, next_poll = POLL_FIRST, started + POLL_FIRST
    try:
        while not settled(doc) and time.monotonic() < deadline:
            where = f" on {doc['nodeId']}" if doc.get("nodeId") else ""
            spinner.show(f"{doc['id']} is {doc.get('state')}{where}; waiting until it is "
                         f"active ({time.monotonic() - started:.0f}s)")
            time.sleep(0.1)
            if time.monotonic() >= next_poll:
                doc = ctx.call("reservations.get", reservationId=doc["id"],
                               tenantId=ctx.tenant)
                poll = min(poll * 1.5, POLL_MAX)
                next_poll = time.monotonic() + poll
    finally:
        spinner.clear()
    return doc
