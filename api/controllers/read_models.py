"""The read models nothing else keeps current, caught up by the controllers' leader each tick.

Every create follows the free-GPU index and the reservations read model; the timers, the
queue dispatcher and the NodeLifecycle pass catch up the reservations and the capacity
rollup. The listings (``list`` and ``get`` of every kind) and the usage (``usage.report``)
are kept here. Caught up only when read, the first read after a busy spell would pay for
every event since the last one (a ``usage`` call a week after the last would apply a week of
reservations before it answered), and a pass over 30 s of events would take the server's
time in one lump.

``ReadModelUpkeep.run`` catches both up in a loop of the leader's own, every tick
(api/controllers/runner.py): a read waits for at most a tick's events, and their cost is
spread over the creates that wrote them. A long catch-up (a read model rebuilt after an
upgrade) holds up no other controller. Where the server's event hub runs (always, in
``serve``), the upkeep follows the hub: the events it applies are those the hub has read
(and this process's own saves), kept in memory, so a tick reads nothing from the log that
the hub read already. It records nothing (no actor),
and takes only the locks of the read models it catches up, which no create waits for.
"""

from __future__ import annotations

from typing import Any

# Read models no request path follows and no other pass catches up.
KEPT_CURRENT = ("listings", "usage")


class ReadModelUpkeep:
    def __init__(self, projections: Any) -> None:
        self.projections = projections

    def run(self) -> None:
        """Bring each of ``KEPT_CURRENT`` up to the head: followed as far as the event hub
        has read (``ReadModels.follow``: from the notifications this process saved or its
        hub read, without reading them again), or read from the log where no hub runs."""
        for name in KEPT_CURRENT:
            if self.projections.head_source is not None:
                self.projections.follow(name)
            else:
                self.projections.catch_up(name)
