"""usage: GPU-hours booked and held active, by tenant, pool or day; CSV for billing."""

from __future__ import annotations

import argparse
import csv
import sys
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.output import apply_query, emit
from better_compute.cli.registry import add_verb

EXAMPLES = [
    'better-compute usage --from 2026-11-01 --to 2026-12-01                 # every tenant (root)',
    'better-compute usage --tenant acme --from 2026-11-01 --to 2026-12-01 --by pool,day',
    'better-compute usage --from now-24h --by day -o csv > usage.csv            # for billing',
    'better-compute usage --pool pool_… --from 2026-11-01 --query total.bookedGpuHours',
]


def usage(ctx: Context, a: argparse.Namespace) -> None:
    report = ctx.call("usage.report", **{"from": a.from_time}, to=a.to_time, tenantId=a.tenant,
                      poolId=a.pool, by=a.by)
    if a.output == "csv":
        write_csv(apply_query(report, a.query or "rows"), sys.stdout)
        return
    if a.output == "table" or (a.output is None and sys.stdout.isatty() and not a.query):
        first = {"tenant": "tenantId", "pool": "poolId", "day": "day"}[report["by"][0]]
        emit([*report["rows"], {first: "(total)", **report["total"]}], output="table")
        return
    emit(report, query=a.query, output=a.output)


def write_csv(rows: Any, out: Any) -> None:
    """One header line, then one line per row (the rows of a report, or any list of objects)."""
    rows = rows if isinstance(rows, list) else [rows]
    columns: list[str] = []
    for row in rows:
        columns.extend(k for k in row if k not in columns)
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


def register(sub: Any) -> None:
    p = add_verb(sub, "usage", usage,
                 "GPU-hours booked and held active in [--from, --to), exact to the second; "
                 "running reservations count to now. Root sees every tenant, others their own.",
                 output=False, examples=EXAMPLES)
    p.add_argument("--from", dest="from_time", required=True, metavar="TIME",
                   help="the window's start: RFC 3339, a date (midnight UTC) or now-DURATION "
                   "(e.g. now-30d)")
    p.add_argument("--to", dest="to_time", metavar="TIME",
                   help="the window's end, excluded (same forms; default: now)")
    p.add_argument("--tenant",
                   help="one tenant (default: root tokens see every tenant; others their own)")
    p.add_argument("--pool", metavar="POOL", help="only reservations in this pool")
    p.add_argument("--by", default="tenant", metavar="tenant|pool|day",
                   help="group by tenant (default), pool or day (UTC); several with commas")
    p.add_argument("--output", "-o", choices=["json", "table", "csv"],
                   help="json (default when piped), table (on a terminal) or csv (the rows, "
                   "for billing)")
    p.add_argument("--query", "-q", metavar="JMESPATH",
                   help="print only this part of the answer (with csv: the list of rows to "
                   "write)")
