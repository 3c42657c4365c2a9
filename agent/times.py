"""Times as bcd writes them: RFC 3339 in UTC with a ``Z``."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime, *, timespec: str = "milliseconds") -> str:
    """``2026-01-01T12:00:00.000Z`` (``timespec="seconds"``: ``2026-01-01T12:00:00Z``)."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")
