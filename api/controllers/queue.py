"""The queue dispatcher: places queued reservations and moves placed ones earlier, by itself.

Each pass (``run(now)``) catches the free-GPU and reservations projections up and looks at
the pools whose capacity may have grown since its last pass (a booking ended: release,
cancel, failed binding, end time, a move; a node changed: adopted, uncordoned, a GPU
healthy again; a quota changed) or that have new queued reservations, and runs
``ReservationQueue.dispatch`` on each: first come first served, with backfill that never
delays the head (docs/reservations.md, "The queue"). The first pass after it takes the
controllers' lock looks at every pool.

Like the other controllers it runs in the elected ``serve`` process only, woken by the
events that free GPUs; a pass is idempotent (each change re-reads its reservation inside its
own save) and never sleeps: tests move the clock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from better_compute.api.services.reservation_queue import DispatchReport
from better_compute.api.services.reservations import ReservationService
from better_compute.api.store.actor import CONTROLLER_RESERVATIONS
from better_compute.api.store.outage import outage_error
from better_compute.domain.errors import Unavailable
from better_compute.projections.earliest_index import changed_pools
from better_compute.projections.reservations import queued_pools

log = logging.getLogger("better_compute.controllers")


@dataclass
class PassReport:
    """What one pass did, per pool."""

    pools: dict[str, DispatchReport] = field(default_factory=dict)

    @property
    def placed(self) -> list[str]:
        return [r for report in self.pools.values() for r in report.placed]

    @property
    def rescheduled(self) -> list[str]:
        return [r for report in self.pools.values() for r in report.rescheduled]

    @property
    def changed(self) -> bool:
        return any(report.changed for report in self.pools.values())


class QueueDispatcher:
    """The queue's passes; what they save, ``controller:reservations`` did."""

    actor = CONTROLLER_RESERVATIONS

    def __init__(self, reservations: ReservationService) -> None:
        self.reservations = reservations
        self.seen = 0  # the log position up to which changes were looked at

    def run(self, now: datetime | None = None) -> PassReport:
        report = PassReport()
        service = self.reservations
        runner = service.projections
        runner.settle("free_gpus")  # every tick at least: a search settles only what is new
        runner.followed("reservations")
        mark = min(runner.position(runner.get("free_gpus")),
                   runner.position(runner.get("reservations")))
        pools = set(changed_pools(service.sql, self.seen)) | set(queued_pools(service.sql,
                                                                               self.seen))
        for pool_id in sorted(pools):
            try:
                report.pools[pool_id] = service.dispatch(pool_id, now, actor=self.actor)
                undecided = report.pools[pool_id].undecided
            except Unavailable:  # the store is away: the pass ends, its loop logs it once
                raise
            except Exception as exc:  # one pool's trouble never stops the others
                outage = outage_error(exc)
                if outage is not None:  # a full disk, say: the store's trouble, not the pool's
                    raise outage from exc
                log.exception("dispatching pool %s failed; it is looked at again next pass",
                              pool_id)
                undecided = True
            if undecided:
                mark = min(mark, self.seen)  # the next pass looks at it again
        self.seen = max(self.seen, mark)
        return report
