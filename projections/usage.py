"""The usage read model: each reservation's booked interval and active periods.

One row per reservation in ``bc_usage``, kept from the ``reservation.*``
events alone, with times taken from the events' own fields (the control
plane's clock when it decided), never from when the event was stored:

* ``reservation.placed``: tenant, pool, GPU count, start and end;
* ``reservation.queued``: the same, booking nothing yet (start and end: when it was queued);
* ``reservation.dequeued``, ``reservation.rescheduled``: the start and end it was booked for
  (from the queue; moved earlier);
* ``reservation.extended``: the new end;
* ``reservation.active``: an active period opens (at its ``at``; events
  recorded before that field existed use the event's time);
* ``reservation.released`` / ``.cancelled`` / ``.failed``: it ended at ``at``
  and any open active period closes there;
* ``reservation.replaced``: an open active period closes (a hold on another
  node starts over).

Times are integer microseconds since the epoch (domain/usage.py). The report
(``usage.report``) reads the rows that overlap its window and sums them with
``domain.usage.summarize``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from better_compute.domain.ids import public_id
from better_compute.domain.usage import Usage, to_us
from better_compute.projections import jsontext
from better_compute.projections.framework import ReadModel, Sql


def _at(event: Any) -> int:
    at = getattr(event, "at", None)
    return to_us(at if at is not None else event.timestamp)


_ENDS = frozenset({"reservation.released", "reservation.cancelled", "reservation.failed",
                   "reservation.replaced"})


class UsageProjection(ReadModel):
    name = "usage"
    version = 2  # 2: reservations booked from the queue or moved earlier count from their start

    def table_names(self) -> list[str]:
        return ["bc_usage"]

    def tables(self) -> list[str]:
        return [
            "CREATE TABLE IF NOT EXISTS bc_usage ("
            "uuid TEXT PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL, "
            "pool_id TEXT NOT NULL, gpus BIGINT NOT NULL, start_us BIGINT NOT NULL, "
            "end_us BIGINT NOT NULL, ended_us BIGINT, active TEXT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS bc_usage_start ON bc_usage (start_us)",
        ]

    def wants(self, event_type: type[Any]) -> bool:
        return str(event_type.TOPIC).startswith("reservation.")

    def apply(self, sql: Sql, cursor: Any, sequence: int, event: Any) -> None:
        kind = str(type(event).TOPIC)
        if not kind.startswith("reservation."):
            return
        uuid = str(event.originator_id)
        if kind in ("reservation.placed", "reservation.queued"):
            placed = kind == "reservation.placed"
            sql.execute(
                cursor,
                "INSERT INTO bc_usage (uuid, id, tenant_id, pool_id, gpus, start_us, end_us, "
                "ended_us, active) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, '[]')",
                (uuid, public_id("rsv", event.originator_id), event.tenant_id, event.pool_id,
                 int(event.gpu_count), to_us(event.start if placed else event.at),
                 to_us(event.end if placed else event.at)),
            )
            return
        if kind in ("reservation.dequeued", "reservation.rescheduled"):
            sql.execute(cursor, "UPDATE bc_usage SET start_us = ?, end_us = ? WHERE uuid = ?",
                        (to_us(event.start), to_us(event.end), uuid))
            return
        if kind == "reservation.extended":
            sql.execute(cursor, "UPDATE bc_usage SET end_us = ? WHERE uuid = ?",
                        (to_us(event.end), uuid))
            return
        if kind != "reservation.active" and kind not in _ENDS:
            return  # nothing kept here changes (a binding, a queue's events): no read
        sql.execute(cursor, "SELECT active FROM bc_usage WHERE uuid = ?", (uuid,))
        row = cursor.fetchone()
        if row is None:
            return
        active: list[list[int | None]] = jsontext.loads(row["active"])
        if kind == "reservation.active":
            active.append([_at(event), None])
        else:  # one of _ENDS
            at = _at(event)
            active = [[since, at if until is None else until] for since, until in active]
            if kind != "reservation.replaced":
                sql.execute(cursor, "UPDATE bc_usage SET ended_us = ? WHERE uuid = ?",
                            (at, uuid))
        sql.execute(cursor, "UPDATE bc_usage SET active = ? WHERE uuid = ?",
                    (jsontext.dumps(active), uuid))


def read_usage(sql: Sql, start_us: int, end_us: int, *, tenant_id: str | None = None,
               pool_ids: Sequence[str] = ()) -> list[Usage]:
    """The reservations whose booked interval may overlap [start_us, end_us)."""
    clauses = ["start_us < ?", "COALESCE(ended_us, end_us) > ?"]
    params: list[Any] = [end_us, start_us]
    if tenant_id is not None:
        clauses.append("tenant_id = ?")
        params.append(tenant_id)
    if pool_ids:
        clauses.append(f"pool_id IN ({', '.join('?' for _ in pool_ids)})")
        params.extend(pool_ids)
    with sql.transaction(commit=False) as cursor:
        sql.execute(cursor, f"SELECT * FROM bc_usage WHERE {' AND '.join(clauses)} "
                    "ORDER BY start_us, id", params)
        rows = cursor.fetchall()
    return [Usage(reservation_id=str(r["id"]), tenant_id=str(r["tenant_id"]),
                  pool_id=str(r["pool_id"]), gpus=int(r["gpus"]), start=int(r["start_us"]),
                  end=int(r["end_us"]),
                  ended=None if r["ended_us"] is None else int(r["ended_us"]),
                  active=tuple((int(a), None if b is None else int(b))
                               for a, b in jsontext.loads(r["active"])))
            for r in rows]
