"""Durations like ``30m``, ``2h``, ``1d`` and starts like ``+2h`` or RFC 3339.

Bounds (docs/security.md): a duration is at most ``MAX_DURATION`` (3650d) and
written with at most 9 digits, so no caller's number overflows a date; each
command then checks its own range (a reservation lasts 1m to 366d, a join
token 1m to 24h, a start is at most 366d ahead).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from better_compute.domain.errors import InvalidInput

_DURATION_RE = re.compile(r"^(\d{1,9})([smhd])\Z")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
MAX_DURATION = timedelta(days=3650)


def parse_duration(text: str, *, flag: str = "duration") -> timedelta:
    match = _DURATION_RE.match(text.strip())
    if not match:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidInput(
            f"{flag} {shown!r} is not a duration: write a whole number (at most 9 digits) and "
            "a unit, s, m, h or d (for example 30m, 2h, 1d)"
        )
    value = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if value > MAX_DURATION:
        raise InvalidInput(
            f"{flag} {text.strip()} is longer than any duration this control plane takes "
            f"(at most {MAX_DURATION.days}d)"
        )
    return value


def format_duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_start(text: str, now: datetime, *, flag: str = "--start",
                latest: timedelta = MAX_DURATION) -> datetime:
    """A start time; at most ``latest`` after ``now`` (so adding a duration never overflows)."""
    if text.startswith("+"):
        value = now + parse_duration(text[1:], flag=flag)
    else:
        try:
            value = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            shown = text if len(text) <= 40 else text[:40] + "..."
            raise InvalidInput(
                f"{flag} {shown!r} is neither +DURATION (like +2h) nor an RFC 3339 time "
                "(like 2026-12-01T08:00:00Z)"
            ) from None
        if value.tzinfo is None:
            raise InvalidInput(f"{flag} {text!r} has no time zone: add Z or an offset like +01:00")
    if value - now > latest:
        raise InvalidInput(
            f"{flag} {text} is more than {latest.days}d ahead: start at most {latest.days}d "
            "from now (for example +2h)"
        )
    return value


def parse_instant(text: str, now: datetime, *, flag: str = "--from") -> datetime:
    """A point in time for ranges (audits, usage): ``now``, ``now-DURATION`` or
    ``-DURATION`` (that long ago), ``now+DURATION`` or ``+DURATION``, an RFC 3339 time, or
    a date ``YYYY-MM-DD`` (its midnight, UTC)."""
    text = text.strip()
    if text.startswith("now") and text != "now":
        text = text[3:]  # now-24h is -24h
    if text == "now":
        return now
    if text.startswith("-"):
        return now - parse_duration(text[1:], flag=flag)
    if re.match(r"^\d{4}-\d{2}-\d{2}\Z", text):
        try:
            return datetime.fromisoformat(text + "T00:00:00+00:00")
        except ValueError:
            raise InvalidInput(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None
    try:
        return parse_start(text, now, flag=flag)
    except InvalidInput:
        raise InvalidInput(
            f"{flag} {text!r} is not a time: write an RFC 3339 time (2026-11-01T00:00:00Z), a "
            "date (2026-11-01, midnight UTC), now-DURATION for that long ago (now-24h) or now"
        ) from None
