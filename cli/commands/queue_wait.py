"""Waiting for a queued reservation's placement, with its position on a terminal.

``reserve`` calls ``wait_while_queued`` with the answer of ``reservations.create``: while the
reservation is ``queued`` and the deadline has not passed, it reads the reservation again
(``reservations.get``) and, when standard error is a terminal, shows its position in the
pool's queue on one line that it rewrites. It returns the last answer: placed (the queue
placed it), still queued (the wait ran out: it stays in the queue), cancelled or expired.
Any wait loop can call it on its way (it does nothing for a reservation that is not queued).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from better_compute.cli.context import Caller

POLL_S = 0.5


def position_line(doc: dict[str, Any]) -> str:
    queue = doc.get("queue") or {}
    return (f"{doc['id']} is queued: position {queue.get('position', '?')} in pool "
            f"{doc['poolId']} (waits until {queue.get('deadline')}); Ctrl-C stops waiting, "
            "it stays in the queue")


def wait_while_queued(ctx: Caller, doc: dict[str, Any], deadline: float,
                      out: TextIO | None = None, poll: float = POLL_S) -> dict[str, Any]:
    """``doc`` again once it is no longer queued, or when ``deadline`` (monotonic) passes."""
    stream = out or sys.stderr
    terminal = stream.isatty()
    shown = ""
    while doc.get("state") == "queued":
        if terminal:
            line = position_line(doc)
            if line != shown:
                stream.write("\r\033[K" + line)
                stream.flush()
                shown = line
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(poll, left))
        doc = ctx.call("reservations.get", reservationId=doc["id"], tenantId=ctx.tenant)
    if shown:
        stream.write("\n")
    return doc
