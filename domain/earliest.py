"""The earliest start: the first instant a request fits, computed exactly from the bookings.

Every booking has an end, so when a request does not fit now its earliest start is not an
estimate: it follows from the bookings, and it can only get earlier (a booking that ends
early frees its GPUs sooner; nothing ever ends later than booked without ``extend``).

Times here are *instants*: seconds since the epoch as floats, the way the free-GPU index
stores them (``projections/free_gpus.py``); ``instant``/``moment`` convert exactly, to the
microsecond, both ways.

The rule (docs/reservations.md, "The earliest start"):

1. A request fits on a node at start ``t`` when the placer (``domain/placement.py``) places it
   on that node's candidate for [t, t + length): the node's healthy GPUs that no booking holds
   at any instant of the interval, and its host CPUs and memory less what the bookings
   overlapping the interval hold (the bookings aggregate's own rule).
2. On one node only ``not_before`` or the end of one of its bookings can be the earliest start:
   a start that fits stays fitting when moved earlier, until it crosses a booking's end.
3. The earliest start of a pool is the smallest over its nodes. Among the nodes that fit at that
   instant the placer's packing rule picks (the fewest free GPUs, then the smallest node id),
   except that a ``prefer``-red node among them wins (a reservation moved earlier stays on its
   node when it can).

``earliest_start`` reads nodes in ascending ``lower_bound`` and stops at the first node whose
bound is later than the best start found, so it reads only the few nodes that can matter. A
bound must never be later than the node's true earliest start; ``first_blocks`` computes the
bounds the free-GPU index keeps, and ``lower_bound`` turns them into a node's bound for one
request.

Quota: ``quota_free_at`` is when a tenant's own reservations, ending as booked, leave room
under its quota (a reservation holds quota from its placement, also before its start, until
it ends).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from better_compute.domain.errors import NoCapacity
from better_compute.domain.placement import Candidate, FreeGpu, Placement, PlacementRequest, place

NEVER = 1e300  # an instant later than any booking: "never fits" / "no block"

# Lengths (seconds) the index keeps bounds for: a request of length L uses the longest rung
# that is not longer than L. Gaps between bookings shorter than the rung cannot hold the
# request, so the bound skips them.
RUNGS = (60.0, 900.0, 3600.0, 21600.0, 86400.0)


def instant(value: datetime) -> float:
    return value.timestamp()


def moment(value: float) -> datetime:
    """The datetime of an instant (exact to the microsecond for any booking time)."""
    return datetime.fromtimestamp(value, UTC)


def rung_for(length: float) -> float | None:
    """The longest rung not longer than ``length``; None when every rung is longer."""
    fitting = [r for r in RUNGS if r <= length]
    return fitting[-1] if fitting else None


@dataclass(frozen=True)
class Booking:
    """One booking of a node: GPUs and host resources held for [start, end)."""

    allocation_id: str
    gpus: frozenset[str]
    start: float
    end: float
    cpus: int = 0
    memory_gib: int = 0

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end


@dataclass(frozen=True)
class Timeline:
    """One node as the search sees it: its usable GPUs, host share and bookings.

    ``gpus`` are the GPUs the placer may use (healthy ones); ``gpu_count`` is every GPU of the
    node, which the host capacity is counted on (as the bookings aggregate counts it).
    """

    node_id: str
    gpus: tuple[FreeGpu, ...]
    gpu_count: int
    cpus_per_gpu: int = 0
    memory_gib_per_gpu: int = 0
    bookings: tuple[Booking, ...] = ()
    lower_bound: float = -NEVER

    def candidate(self, start: float, end: float) -> Candidate:
        """What is free on this node for [start, end), as the placer takes it."""
        busy: set[str] = set()
        cpus = memory = 0
        for booking in self.bookings:
            if booking.overlaps(start, end):
                busy.update(booking.gpus)
                cpus += booking.cpus
                memory += booking.memory_gib
        return Candidate(
            node_id=self.node_id,
            free_gpus=tuple(g for g in self.gpus if g.uuid not in busy),
            cpus_per_gpu=self.cpus_per_gpu, memory_gib_per_gpu=self.memory_gib_per_gpu,
            free_cpus=self.cpus_per_gpu * self.gpu_count - cpus,
            free_memory_gib=self.memory_gib_per_gpu * self.gpu_count - memory,
        )

    def starts(self, not_before: float) -> list[float]:
        """The only instants that can be this node's earliest start, ascending."""
        return sorted({not_before, *(b.end for b in self.bookings if b.end > not_before)})

    def without(self, allocation_id: str) -> Timeline:
        """This node with one booking taken away (a reservation looking for an earlier slot)."""
        kept = tuple(b for b in self.bookings if b.allocation_id != allocation_id)
        return Timeline(self.node_id, self.gpus, self.gpu_count, self.cpus_per_gpu,
                        self.memory_gib_per_gpu, kept, self.lower_bound)

    def with_booking(self, booking: Booking) -> Timeline:
        return Timeline(self.node_id, self.gpus, self.gpu_count, self.cpus_per_gpu,
                        self.memory_gib_per_gpu, (*self.bookings, booking), self.lower_bound)


@dataclass(frozen=True)
class Slot:
    """Where and when a request fits: [start, end) on ``placement``'s node and GPUs."""

    start: float
    end: float
    placement: Placement


def fits_at(request: PlacementRequest, timeline: Timeline, start: float, end: float
            ) -> Placement | None:
    """The placement of ``request`` on this node for [start, end), or None."""
    candidate = timeline.candidate(start, end)
    if sum(1 for g in candidate.free_gpus if request.qualifies(g)) < request.gpus:
        return None
    try:
        return place(request, [candidate])
    except NoCapacity:
        return None


def node_earliest(request: PlacementRequest, length: float, not_before: float,
                  timeline: Timeline) -> Slot | None:
    """The earliest start of ``request`` on one node (at or after ``not_before``), or None."""
    if request.gpus > len(timeline.gpus) or timeline.node_id in request.exclude_nodes:
        return None
    for start in timeline.starts(not_before):
        placement = fits_at(request, timeline, start, start + length)
        if placement is not None:
            return Slot(start, start + length, placement)
    return None


def earliest_start(request: PlacementRequest, length: float, not_before: float,
                   timelines: Iterable[Timeline], prefer: str | None = None) -> Slot | None:
    """The earliest slot of ``request`` over ``timelines``, or None when no node can hold it.

    ``timelines`` must come in ascending ``lower_bound``, each bound no later than the node's
    earliest start: the search stops reading at the first node whose bound is later than the
    best start found (nodes whose bound equals it are read: they may tie).
    """
    best: float | None = None
    tied: list[Timeline] = []
    for timeline in timelines:
        if timeline.lower_bound >= NEVER or (best is not None and timeline.lower_bound > best):
            break
        slot = node_earliest(request, length, not_before, timeline)
        if slot is None:
            continue
        if best is None or slot.start < best:
            best, tied = slot.start, [timeline]
        elif slot.start == best:
            tied.append(timeline)
    if best is None:
        return None
    preferred = [t for t in tied if t.node_id == prefer]
    chosen = place(request, [t.candidate(best, best + length) for t in preferred or tied])
    return Slot(best, best + length, chosen)


# ------------------------------------------------------------------ bounds for the index

def _gaps(bookings: Sequence[Booking], uuid: str) -> list[tuple[float, float]]:
    """The intervals in which one GPU is free: [a, b) between its bookings (open to -inf and inf)."""
    held = sorted((b.start, b.end) for b in bookings if uuid in b.gpus)
    gaps: list[tuple[float, float]] = []
    free_from = -NEVER
    for start, end in held:
        if start > free_from:
            gaps.append((free_from, start))
        free_from = max(free_from, end)
    gaps.append((free_from, NEVER))
    return gaps


def first_blocks(usable: Sequence[str], gpu_count: int, bookings: Sequence[Booking],
                 rung: float, schedulable: bool = True) -> list[tuple[int, float, float]]:
    """Per GPU count k (1..gpu_count): the first block of the node for requests of k GPUs.

    A block is an open interval (from, until) in which, at every instant t, fewer than k of
    the ``usable`` GPUs are free for the whole of [t, t + rung): no request of k GPUs lasting
    ``rung`` or longer can start inside it, so a request looking from ``t0`` inside the block
    cannot start before ``until``. (NEVER, NEVER): no block at all; (-NEVER, NEVER): the node
    can never hold k GPUs (not schedulable, or fewer than k usable GPUs).
    """
    if not schedulable:
        return [(k, -NEVER, NEVER) for k in range(1, gpu_count + 1)]
    # Instants at which a GPU is free for [t, t + rung): closed intervals [a, b - rung].
    windows: list[tuple[float, float]] = []
    for uuid in usable:
        for a, b in _gaps(bookings, uuid):
            if b >= NEVER:
                windows.append((a, NEVER))
            elif b - a >= rung:
                windows.append((a, b - rung))
    points = sorted({x for w in windows for x in w if -NEVER < x < NEVER})
    index = {x: i for i, x in enumerate(points)}
    n = len(points)
    # at_point[i]: free GPUs at points[i]; between[i]: on the open interval before points[i]
    # (between[n]: after the last point).
    at_point = [0] * (n + 1)
    between = [0] * (n + 2)
    for a, b in windows:
        first = 0 if a <= -NEVER else index[a]
        last = n - 1 if b >= NEVER else index[b]
        at_point[first] += 1
        at_point[last + 1] -= 1
        seg_first = 0 if a <= -NEVER else first + 1
        seg_last = n if b >= NEVER else last
        between[seg_first] += 1
        between[seg_last + 1] -= 1
    free_at, free_between = [], []
    running = 0
    for i in range(n):
        running += at_point[i]
        free_at.append(running)
    running = 0
    for i in range(n + 1):
        running += between[i]
        free_between.append(running)
    out = []
    for k in range(1, gpu_count + 1):
        if k > len(usable):
            out.append((k, -NEVER, NEVER))
            continue
        block: tuple[int, float, float] = (k, NEVER, NEVER)
        for i in range(1, n + 1):
            if free_between[i] < k:  # the open interval (points[i-1], points[i] or ∞)
                until = NEVER
                for j in range(i, n):
                    if free_at[j] >= k:
                        until = points[j]
                        break
                block = (k, points[i - 1], until)
                break
        out.append(block)
    return out


def lower_bound(block_from: float, block_until: float, not_before: float) -> float:
    """A node's bound for a request looking from ``not_before``, from its first block."""
    if block_from < not_before < block_until:
        return block_until
    return not_before


# ------------------------------------------------------------------------------ quota

def quota_free_at(limit: int | None, held: Sequence[tuple[int, float]], need: int,
                  not_before: float) -> float | None:
    """When ``need`` more GPUs fit under ``limit``, if held reservations end as booked.

    ``held``: (GPUs, end) of each reservation holding the tenant's quota on the pool. None
    when ``need`` alone is more than the quota.
    """
    if limit is None:
        return not_before
    if need > limit:
        return None
    ends = sorted(held, key=lambda h: h[1])
    in_use = sum(g for g, _ in ends)
    at = not_before
    for gpus, end in ends:
        if in_use + need <= limit:
            break
        in_use -= gpus
        at = max(at, end)
    return at if in_use + need <= limit else None

