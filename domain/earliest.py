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
bound must never be later than the node's true earliest start; ``node_index`` computes what
the free-GPU index keeps (per GPU count: the node's first block, and its booking ends with how
long enough GPUs stay free after each), and ``lower_bound`` turns that into a node's bound
for one request.

Quota: ``quota_free_at`` is when a tenant's own reservations, ending as booked, leave room
under its quota (a reservation holds quota from its placement, also before its start, until
it ends).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from better_compute.domain.errors import NoCapacity
from better_compute.domain.placement import Candidate, FreeGpu, Placement, PlacementRequest, place

NEVER = 1e300  # an instant later than any booking: "never fits" / "no block"

def instant(value: datetime) -> float:
    return value.timestamp()


def moment(value: float) -> datetime:
    """The datetime of an instant (exact to the microsecond for any booking time)."""
    return datetime.fromtimestamp(value, UTC)


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

def free_counts(usable: Sequence[str], bookings: Sequence[Booking]) -> list[tuple[float, int]]:
    """How many ``usable`` GPUs are free at each instant: (t, n) means n from t on.

    Starts at (-NEVER, all); a booking holds its GPUs for [start, end), so the count drops at
    a start and rises at an end.
    """
    wanted = set(usable)
    delta: dict[float, int] = {}
    for booking in bookings:
        held = len(booking.gpus & wanted)
        if held and booking.end > booking.start:
            delta[booking.start] = delta.get(booking.start, 0) - held
            delta[booking.end] = delta.get(booking.end, 0) + held
    steps = [(-NEVER, len(wanted))]
    for t in sorted(delta):
        if delta[t]:
            steps.append((t, steps[-1][1] + delta[t]))
    return steps


def _host_use_after(bookings: Sequence[Booking], at: float
                    ) -> tuple[list[float], list[int], list[int]]:
    """The bookings still running or to come at ``at``, by start: starts and running sums of
    their CPUs and memory (the bookings aggregate counts every booking that overlaps an
    interval, an upper bound, so [at, at + x) holds the sums up to the last start before
    at + x)."""
    starts: list[float] = []
    cpus: list[int] = []
    memory: list[int] = []
    for booking in sorted((b for b in bookings if b.end > at), key=lambda b: b.start):
        starts.append(booking.start)
        cpus.append((cpus[-1] if cpus else 0) + booking.cpus)
        memory.append((memory[-1] if memory else 0) + booking.memory_gib)
    return starts, cpus, memory


def _host_free_for(use: tuple[list[float], list[int], list[int]], at: float, spare_cpus: int,
                   spare_memory: int) -> float:
    """How long from ``at`` the bookings overlapping [at, at + x) leave the spare host share:
    until the start of the first booking whose share no longer fits."""
    starts, cpus, memory = use
    first = min(bisect_right(cpus, spare_cpus), bisect_right(memory, spare_memory))
    return NEVER if first == len(starts) else max(0.0, starts[first] - at)


def node_index(usable: Sequence[str], gpu_count: int, bookings: Sequence[Booking],
               schedulable: bool = True, cpus_per_gpu: int = 0, memory_gib_per_gpu: int = 0
               ) -> tuple[list[tuple[int, float, float]], list[tuple[int, float, float]]]:
    """What the free-GPU index keeps of a node, per GPU count k (1..gpu_count).

    Blocks: (k, from, until), the node's first interval [from, until) in which fewer than k
    of its usable GPUs are free; (NEVER, NEVER): none; (-NEVER, NEVER): the node can never
    hold k GPUs (not schedulable, or fewer than k usable GPUs).
    Ends: (k, at, free_for) for each end of a booking after which at least k usable GPUs are
    free: ``free_for`` is how long both the k-th longest-free of them stays free and the
    host share of k GPUs stays available (NEVER: for ever). A request of k GPUs for L can
    start at ``at`` only if ``free_for >= L``.
    """
    if not schedulable:
        return [(k, -NEVER, NEVER) for k in range(1, gpu_count + 1)], []
    steps = free_counts(usable, bookings)
    blocks: list[tuple[int, float, float]] = []
    for k in range(1, gpu_count + 1):
        if k > len(usable):
            blocks.append((k, -NEVER, NEVER))
            continue
        block = (NEVER, NEVER)
        for i, (t, free) in enumerate(steps):
            if free < k:
                block = (t, next((u for u, n in steps[i + 1:] if n >= k), NEVER))
                break
        blocks.append((k, *block))
    held = {u: sorted((b.start, b.end) for b in bookings if u in b.gpus) for u in usable}
    ends: list[tuple[int, float, float]] = []
    for at in sorted({b.end for b in bookings}):
        free_for = []
        for intervals in held.values():
            i = bisect_right(intervals, (at, NEVER))  # the first booking starting after at
            if i and intervals[i - 1][1] > at:
                continue  # busy at this instant
            free_for.append(intervals[i][0] - at if i < len(intervals) else NEVER)
        free_for.sort(reverse=True)
        use = _host_use_after(bookings, at)
        for k in range(1, min(len(free_for), gpu_count) + 1):
            host = _host_free_for(use, at, cpus_per_gpu * (gpu_count - k),
                                  memory_gib_per_gpu * (gpu_count - k))
            ends.append((k, at, min(free_for[k - 1], host)))
    return blocks, ends


def blocked_at(block_from: float, block_until: float, not_before: float) -> bool:
    """Whether a node's first block holds ``not_before``: fewer than k GPUs free there."""
    return block_from <= not_before < block_until


def lower_bound(block: tuple[float, float], ends: Iterable[tuple[float, float]],
                length: float, not_before: float) -> float:
    """A node's bound for a request of ``length`` looking from ``not_before``.

    ``not_before`` when the node is not blocked there (it may fit at once); else the first
    booking end after ``not_before`` after which enough GPUs stay free for ``length`` (the
    earliest start of a node that cannot start at once is such an end), NEVER when none is.
    """
    if not blocked_at(*block, not_before):
        return not_before
    return min((at for at, free_for in ends if at > not_before and free_for >= length),
               default=NEVER)


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

