"""The reservations controller: the timers of reservations, one pass at a time.

Each pass (``tick(now)``) catches the reservations projection up and acts on
what is due at ``now`` (the service's database time unless a test passes it):

* placed and started: ``reservation.binding``; the node's desired state gains
  the hold's device assignment;
* binding and no report from the node for BIND_TIMEOUT (5 minutes): a
  failure, placed again at most twice, then ``reservation.failed``;
* any live reservation past its end: ``reservation.released`` (reason
  ``expired``), bookings ended, quota refunded, assignment removed;
* a queued reservation past its queue timeout: ``reservation.expired`` (it held
  nothing, so nothing ends and nothing is refunded).

A pass is idempotent (each change re-reads its reservation inside its own
save) and never sleeps: tests move the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from better_compute.api.services.reservations import ReservationService
from better_compute.api.store.actor import CONTROLLER_RESERVATIONS
from better_compute.projections.reservations import due_reservations

MAX_ROUNDS = 4  # a re-placement can make a reservation due again in the same pass


@dataclass
class TickReport:
    binding: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    queue_expired: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.binding or self.timed_out or self.expired or self.queue_expired)


class ReservationTimers:
    """The timers' passes; what they save, ``controller:reservations`` did."""

    actor = CONTROLLER_RESERVATIONS

    def __init__(self, reservations: ReservationService) -> None:
        self.reservations = reservations

    def tick(self, now: datetime | None = None) -> TickReport:
        report = TickReport()
        service = self.reservations
        for _ in range(MAX_ROUNDS):
            at = now or service.now()
            service.projections.followed("reservations")
            due = due_reservations(service.sql, at.timestamp())
            acted = False
            starting = [row for row in due if row["state"] == "placed"
                        and row["end_at"] > at.timestamp()]
            if starting:  # one save for all of them (a stream of creates)
                bound = {str(u) for u in service.begin_bindings(
                    [UUID(str(row["uuid"])) for row in starting], at, actor=self.actor)}
                report.binding.extend(str(row["id"]) for row in starting
                                      if str(row["uuid"]) in bound)
                acted = acted or bool(bound)
            for row in due:
                uuid = UUID(str(row["uuid"]))
                if row["state"] == "queued":
                    if service.expire_queued(uuid, at, actor=self.actor):
                        report.queue_expired.append(str(row["id"]))
                        acted = True
                elif row["end_at"] <= at.timestamp():
                    if service.expire(uuid, at, actor=self.actor):
                        report.expired.append(str(row["id"]))
                        acted = True
                elif row["state"] == "placed":
                    continue  # bound above, all in one save
                elif row["state"] == "binding":
                    rsv = service.get_aggregate(uuid)
                    if rsv is not None and service.bind_failed(
                        None, rsv.allocation_id, "timeout",
                        f"node {rsv.node_id} did not report the hold within 5 minutes", at,
                        actor=self.actor,
                    ):
                        report.timed_out.append(str(row["id"]))
                        acted = True
            if not acted:
                break
        return report
