"""Node bookings: which GPUs of one node are booked for which time intervals.

One ``NodeBookings`` aggregate per node (its id is derived from the node id).
A booking holds GPUs plus their host CPUs and memory for the half-open
interval [start, end); a GPU is free for [s, e) when no booking of it
overlaps. Saving a reservation together with its node's bookings (and the
tenant's quota use) in one atomic write is what makes double booking
impossible: two racing placements on one node save the same aggregate
version, and the loser is refused and places again.

Events (internal, owned by the pool's owner, so offered tenants never see
them): ``bookings.opened``, ``bookings.booked``, ``bookings.extended``,
``bookings.ended``. A booking that ended leaves the state at once: every
request starts at or after the store's current time, so it can no longer
overlap anything, except by a time read before its end was saved. So each
GPU keeps when its last booking ended (``freed``), and a booking never starts
before that: a start read earlier moves to it (docs/decisions.md, "Recorded
bookings never overlap").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.errors import Conflict, InvalidInput
from better_compute.domain.ids import named_uuid


def bookings_uuid(node_id: str) -> UUID:
    return named_uuid("node-bookings", node_id)


def overlaps(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> bool:
    """Half-open intervals [a_start, a_end) and [b_start, b_end) share an instant."""
    return a_start < b_end and b_start < a_end


class NodeBookings(TenantOwned):
    PREFIX = "bookings"  # internal: shown only to the pool's owner
    TOPIC = "bc.aggregate.bookings"
    # Every event gives an attribute a new value, never changes one in place: the aggregate
    # cache hands out shallow copies (api/store/aggregate_cache.py, COPY_ON_WRITE).
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.bookings.event"

    @staticmethod
    def create_id(node_id: str, **_: Any) -> UUID:
        return bookings_uuid(node_id)

    @event("Opened", topic="bookings.opened")
    def __init__(self, tenant_id: str, node_id: str, pool_id: str) -> None:
        self.tenant_id = tenant_id
        self.node_id = node_id
        self.pool_id = pool_id
        self.bookings: dict[str, dict[str, Any]] = {}
        self.freed: dict[str, datetime] = {}  # GPU -> when its last booking that ran ended

    # ------------------------------------------------------------- queries

    def conflicts(self, gpus: list[str], start: datetime, end: datetime,
                  ignore: str | None = None) -> list[str]:
        """GPUs of ``gpus`` that another booking holds at some instant of [start, end)."""
        wanted = set(gpus)
        taken: set[str] = set()
        for alloc, booking in self.bookings.items():
            if alloc == ignore:
                continue
            if overlaps(start, end, booking["start"], booking["end"]):
                taken.update(wanted.intersection(booking["gpus"]))
        return sorted(taken)

    def host_use(self, start: datetime, end: datetime) -> tuple[int, int]:
        """CPUs and GiB booked by bookings overlapping [start, end) (an upper bound)."""
        cpus = mem = 0
        for booking in self.bookings.values():
            if overlaps(start, end, booking["start"], booking["end"]):
                cpus += booking["cpus"]
                mem += booking["memoryGiB"]
        return cpus, mem

    def booking(self, allocation_id: str) -> dict[str, Any] | None:
        return self.bookings.get(allocation_id)

    def free_from(self, gpus: list[str]) -> datetime | None:
        """When the last booking of any of ``gpus`` that had started ended (None: none)."""
        freed = getattr(self, "freed", {})  # (aggregates cached before it was kept)
        ends = [freed[g] for g in gpus if g in freed]
        return max(ends) if ends else None

    # ------------------------------------------------------------ commands

    def book(
        self, *, allocation_id: str, reservation_id: str, holder: str, gpus: list[str],
        cpus: int, memory_gib: int, start: datetime, end: datetime,
        cpu_capacity: int | None = None, memory_capacity_gib: int | None = None,
    ) -> tuple[datetime, datetime]:
        """Book ``gpus`` for [start, end); Conflict when any is taken at some instant. A
        start before the GPUs' last booking ended (``free_from``: a time read before that end
        was saved) moves to that end, the length kept. Returns the interval booked."""
        if end <= start:
            raise InvalidInput("a booking must end after it starts")
        free_from = self.free_from(gpus)
        if free_from is not None and start < free_from:
            start, end = free_from, end + (free_from - start)
        if not gpus or len(set(gpus)) != len(gpus):
            raise InvalidInput("a booking needs distinct GPUs")
        if allocation_id in self.bookings:
            raise Conflict(f"allocation {allocation_id} is already booked on {self.node_id}")
        taken = self.conflicts(gpus, start, end)
        if taken:
            raise Conflict(
                f"GPU{'s' if len(taken) > 1 else ''} {', '.join(taken)} of node {self.node_id} "
                f"{'are' if len(taken) > 1 else 'is'} booked for part of "
                f"{iso(start)}..{iso(end)}: place again"
            )
        if cpu_capacity is not None or memory_capacity_gib is not None:
            used_cpus, used_mem = self.host_use(start, end)
            if (cpu_capacity is not None and used_cpus + cpus > cpu_capacity) or (
                memory_capacity_gib is not None and used_mem + memory_gib > memory_capacity_gib
            ):
                raise Conflict(
                    f"node {self.node_id} has not enough host CPUs or memory left for "
                    f"{cpus} CPUs and {memory_gib} GiB: place again"
                )
        self._booked(node_id=self.node_id, allocation_id=allocation_id,
                     reservation_id=reservation_id, holder=holder, gpus=list(gpus), cpus=cpus,
                     memory_gib=memory_gib, start=start, end=end)
        return start, end

    @event("Booked", topic="bookings.booked")
    def _booked(self, node_id: str, allocation_id: str, reservation_id: str, holder: str,
                gpus: list[str], cpus: int, memory_gib: int, start: datetime, end: datetime
                ) -> None:
        self.bookings = {
            **self.bookings,
            allocation_id: {"reservationId": reservation_id, "holder": holder, "gpus": gpus,
                            "cpus": cpus, "memoryGiB": memory_gib, "start": start, "end": end},
        }

    def extend(self, allocation_id: str, end: datetime) -> None:
        """Move the end of a booking later; Conflict when its GPUs are taken meanwhile."""
        booking = self.bookings.get(allocation_id)
        if booking is None:
            raise Conflict(f"allocation {allocation_id} holds nothing on node {self.node_id}")
        if end <= booking["end"]:
            return
        taken = self.conflicts(booking["gpus"], booking["end"], end, ignore=allocation_id)
        freed = getattr(self, "freed", {})  # another booking ran on a GPU after this one's end
        taken += [g for g in booking["gpus"] if g not in taken and freed.get(g, booking["end"])
                  > booking["end"]]
        if taken:
            raise Conflict(
                f"GPU{'s' if len(taken) > 1 else ''} {', '.join(taken)} "
                f"{'are' if len(taken) > 1 else 'is'} booked by another reservation between "
                f"{iso(booking['end'])} and {iso(end)}: extend by less, or reserve again later"
            )
        self._extended(node_id=self.node_id, allocation_id=allocation_id, end=end)

    @event("Extended", topic="bookings.extended")
    def _extended(self, node_id: str, allocation_id: str, end: datetime) -> None:
        self.bookings = {**self.bookings,
                         allocation_id: {**self.bookings[allocation_id], "end": end}}

    def end(self, allocation_id: str, at: datetime) -> bool:
        """End a booking at ``at`` (or drop it when it had not started); False if absent."""
        if allocation_id not in self.bookings:
            return False
        self._ended(node_id=self.node_id, allocation_id=allocation_id, at=at)
        return True

    @event("Ended", topic="bookings.ended")
    def _ended(self, node_id: str, allocation_id: str, at: datetime) -> None:
        ended = self.bookings[allocation_id]
        self.bookings = {k: v for k, v in self.bookings.items() if k != allocation_id}
        if at > ended["start"]:  # it ran: its GPUs were held until ``at`` (or its end)
            until = min(at, ended["end"])
            freed = getattr(self, "freed", {})
            self.freed = {**freed, **{g: max(until, freed.get(g, until)) for g in ended["gpus"]}}

    def to_doc(self) -> dict[str, Any]:
        return {
            "nodeId": self.node_id,
            "poolId": self.pool_id,
            "bookings": [
                {"allocationId": alloc, **{k: (iso(v) if isinstance(v, datetime) else v)
                                           for k, v in b.items()}}
                for alloc, b in sorted(self.bookings.items())
            ],
        }
