"""The bounds of /watch streams: bytes per write, the window in bytes, slow and revoked readers.

api/http/watch.py streams; this module holds what bounds a stream (docs/security.md,
"Bounds", and docs/events.md, "Slow readers and memory"):

- ``MAX_WRITE_BYTES``: the lines of one write (one longer line goes alone);
- ``WINDOW_BYTES``: the default bound of the hub's window of recent events;
- ``catch_up``: one store read of a stream that started older than the window;
- ``fell_behind``: the end of a stream that fell out of the window while live;
- ``credential_ended``: the end of a stream whose token was revoked (or expired).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from better_compute.api.store.eventlog import EventFilter, LogEntry
from better_compute.domain.access import Principal
from better_compute.domain.errors import BetterComputeError, FellBehind, Unauthenticated

if TYPE_CHECKING:
    from better_compute.api.http.follower import WatchHub

MAX_WRITE_BYTES = 256 * 1024
WINDOW_BYTES = 16 << 20
CATCH_UP_PAGE = 100  # events a stream reads from the store at a time while catching up


def revoked_tokens(entries: list[LogEntry]) -> list[str]:
    return [str(msgspec.json.decode(e.line).get("subject")) for e in entries
            if e.type == "token.revoked"]


def credential_ended(hub: WatchHub, principal: Principal | None) -> BetterComputeError | None:
    """Why this stream's token no longer admits it (None: it still does).

    Checked at every wake of the stream (each publish, and the hub's tick at
    least once a second). Revocation, seen in the log by every replica; a token's
    lifetime ending is TokenCheck's (api/http/watch.py), which asks authentication again.
    """
    if principal is None or principal.token_id is None:
        return None
    if principal.token_id in hub.revoked:
        return Unauthenticated(
            f"token {principal.token_id} was revoked: this stream ends; ask an admin of your "
            "tenant for a new token"
        )
    return None  # a token's end: TokenCheck in api/http/watch.py, by the service's clock


def fell_behind(hub: WatchHub, position: int) -> FellBehind:
    return FellBehind(
        f"this stream fell behind the event log by more than the server keeps for live "
        f"readers ({hub.window:,} events or {hub.window_bytes // 1024:,} KiB): resume with "
        f"--since {position} (`better-compute events watch` resumes by itself)",
        data={"since": position},
    )


def catch_up(hub: WatchHub, flt: EventFilter, position: int) -> tuple[bytes, int]:
    """One store read of a stream older than the window: its next write and position."""
    entries, read_to = hub.log.scan(flt, position, limit=CATCH_UP_PAGE)
    lines: list[bytes] = []
    size = 0
    for entry in entries:
        if lines and size + len(entry.line) + 1 > MAX_WRITE_BYTES:
            return b"".join(lines), position  # the rest in the next read
        lines.append(entry.line + b"\n")
        size += len(entry.line) + 1
        position = entry.sequence
    return b"".join(lines), read_to
