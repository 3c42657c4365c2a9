"""GPU-hours: what each reservation booked and held, summed by tenant, pool and day.

Pure arithmetic on integer microseconds since the epoch (no floating point,
so sums are exact). For one reservation of ``gpus`` GPUs:

* **booked**: [start, end) — its start to its end, or to when it ended early
  (released, cancelled, failed), and never past ``now`` (a running
  reservation counts to now; the future is not usage yet);
* **active**: the periods its hold was ``active`` on a node (from the
  verified AllocationBound to the end), capped the same way.

Each interval is clipped to the report's window [from, to) and, by day,
split at UTC midnights; GPU-seconds are the interval's length times the GPU
count. Reported seconds are whole seconds, rounded down, of the exact sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from better_compute.domain.errors import InvalidInput

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
US_PER_S = 1_000_000
DAY_US = 86_400 * US_PER_S
BY_KEYS = ("tenant", "pool", "day")
MAX_WINDOW = timedelta(days=3660)


def to_us(value: datetime) -> int:
    """Microseconds since the epoch, exactly."""
    return (value - EPOCH) // timedelta(microseconds=1)


def from_us(value: int) -> datetime:
    return EPOCH + timedelta(microseconds=value)


@dataclass(frozen=True)
class Usage:
    """One reservation as usage counts it (all times in microseconds since the epoch)."""

    reservation_id: str
    tenant_id: str
    pool_id: str
    gpus: int
    start: int
    end: int
    ended: int | None = None
    active: tuple[tuple[int, int | None], ...] = ()  # (since, until or None: still active)

    def booked(self, now: int) -> tuple[int, int]:
        stop = min(self.end, now if self.ended is None else self.ended, now)
        return self.start, stop

    def active_periods(self, now: int) -> list[tuple[int, int]]:
        cap = min(self.end, now if self.ended is None else self.ended, now)
        return [(since, min(until if until is not None else cap, cap))
                for since, until in self.active]


def parse_by(by: str | Sequence[str] | None) -> tuple[str, ...]:
    items = [by] if isinstance(by, str) else list(by or ["tenant"])
    keys = tuple(dict.fromkeys(p.strip() for item in items for p in item.split(",") if p.strip()))
    unknown = [k for k in keys if k not in BY_KEYS]
    if unknown or not keys:
        raise InvalidInput(f"--by {','.join(unknown) or '(nothing)'} is not a grouping: use "
                           "tenant, pool or day, or several with commas (tenant,day)")
    return keys


def check_window(start: datetime, end: datetime) -> None:
    if end <= start:
        raise InvalidInput(f"--to {end.isoformat()} is not after --from {start.isoformat()}: the "
                           "report covers [from, to)")
    if end - start > MAX_WINDOW:
        raise InvalidInput("the report covers at most 3660 days: narrow --from and --to")


@dataclass
class _Sum:
    reservations: set[str] = field(default_factory=set)
    booked_us: int = 0
    active_us: int = 0


def _pieces(lo: int, hi: int, by_day: bool) -> Iterable[tuple[int, int, str | None]]:
    """[lo, hi) as is, or split at UTC midnights with each piece's day."""
    if not by_day:
        yield lo, hi, None
        return
    while lo < hi:
        midnight = (lo // DAY_US + 1) * DAY_US
        day = from_us(lo).date().isoformat()
        yield lo, min(hi, midnight), day
        lo = midnight


def summarize(usages: Iterable[Usage], start: datetime, end: datetime, now: datetime,
              by: Sequence[str]) -> dict[str, Any]:
    """GPU-seconds and GPU-hours booked and active in [start, end), grouped ``by``."""
    lo_w, hi_w, now_us = to_us(start), to_us(end), to_us(now)
    by_day = "day" in by
    sums: dict[tuple[str, ...], _Sum] = {}
    total = _Sum()

    def add(u: Usage, lo: int, hi: int, kind: str) -> None:
        lo, hi = max(lo, lo_w), min(hi, hi_w)
        for a, b, day in _pieces(lo, hi, by_day):
            if b <= a:
                continue
            values = {"tenant": u.tenant_id, "pool": u.pool_id, "day": day or ""}
            key = tuple(values[k] for k in by)
            for bucket in (sums.setdefault(key, _Sum()), total):
                bucket.reservations.add(u.reservation_id)
                if kind == "booked":
                    bucket.booked_us += (b - a) * u.gpus
                else:
                    bucket.active_us += (b - a) * u.gpus

    for usage in usages:
        add(usage, *usage.booked(now_us), "booked")
        for since, until in usage.active_periods(now_us):
            add(usage, since, until, "active")
    names = {"tenant": "tenantId", "pool": "poolId", "day": "day"}
    rows = [{**{names[k]: v for k, v in zip(by, key, strict=True)}, **_figures(s)}
            for key, s in sorted(sums.items())]
    return {"from": _iso(start), "to": _iso(end), "now": _iso(now), "by": list(by),
            "rows": rows, "total": _figures(total)}


def _figures(s: _Sum) -> dict[str, Any]:
    booked, active = s.booked_us // US_PER_S, s.active_us // US_PER_S
    return {"reservations": len(s.reservations),
            "bookedGpuSeconds": booked, "bookedGpuHours": round(booked / 3600, 6),
            "activeGpuSeconds": active, "activeGpuHours": round(active / 3600, 6)}


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
