"""domain/usage.py and the instants ranges take: exact integer arithmetic, no I/O."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from better_compute.domain.durations import parse_instant
from better_compute.domain.errors import InvalidInput
from better_compute.domain.usage import Usage, parse_by, summarize, to_us

NOW = datetime(2031, 5, 2, 6, 0, tzinfo=UTC)


def at(hour: float) -> int:
    """Microseconds of 2031-05-01 00:00 UTC plus ``hour`` hours."""
    return to_us(datetime(2031, 5, 1, tzinfo=UTC) + timedelta(hours=hour))


def test_instants() -> None:
    assert parse_instant("now", NOW) == NOW
    assert parse_instant("now-24h", NOW) == parse_instant("-24h", NOW) == NOW - timedelta(days=1)
    assert parse_instant("now+2h", NOW) == NOW + timedelta(hours=2)
    assert parse_instant("2031-05-01", NOW) == datetime(2031, 5, 1, tzinfo=UTC)
    assert parse_instant("2031-05-01T10:00:00+02:00", NOW) == datetime(2031, 5, 1, 8, tzinfo=UTC)
    for bad in ("yesterday", "2031-13-01", "2031-05-01T10:00:00", "now-1y"):
        with pytest.raises(InvalidInput):
            parse_instant(bad, NOW, flag="--from")


def test_microseconds_are_exact_and_seconds_round_down() -> None:
    odd = Usage("rsv_a", "acme", "pool_a", 3, at(1), at(1) + 1_500_001, None, ())
    report = summarize([odd], datetime(2031, 5, 1, tzinfo=UTC), NOW, NOW, ("tenant",))
    assert report["total"]["bookedGpuSeconds"] == 4  # 3 x 1.500001 s = 4.500003 s
    assert to_us(datetime(2031, 5, 1, 0, 0, 0, 7, tzinfo=UTC)) % 1_000_000 == 7


def test_booked_and_active_capped_at_the_end_at_now_and_split_at_midnight() -> None:
    rows = [
        # 2 GPUs 22:00 -> 02:00 next day, active from 22:30, still running (ended None)
        Usage("rsv_a", "acme", "pool_a", 2, at(22), at(26), None, ((at(22.5), None),)),
        # cancelled before its start: nothing
        Usage("rsv_b", "acme", "pool_a", 8, at(10), at(12), at(9), ()),
        # 1 GPU booked until 40:00 but now is 30:00 (2031-05-02T06:00): counts to now
        Usage("rsv_c", "globex", "pool_b", 1, at(29), at(40), None, ()),
    ]
    report = summarize(rows, datetime(2031, 5, 1, tzinfo=UTC), NOW + timedelta(days=1), NOW,
                       parse_by("day,tenant"))
    assert [(r["day"], r["tenantId"], r["bookedGpuSeconds"], r["activeGpuSeconds"],
             r["reservations"]) for r in report["rows"]] == [
        ("2031-05-01", "acme", 2 * 2 * 3600, 2 * 5400, 1),
        ("2031-05-02", "acme", 2 * 2 * 3600, 2 * 2 * 3600, 1),
        ("2031-05-02", "globex", 3600, 0, 1),
    ]
    assert report["total"]["reservations"] == 2 and report["total"]["bookedGpuHours"] == 9.0
    with pytest.raises(InvalidInput, match="--by node"):
        parse_by("tenant,node")
