"""A pool's line: first come, first served, with backfill that never delays the head.

The line of a pool is its queued reservations and its placed reservations that may move
earlier (``--start earliest`` or ``--move-earlier``, not started yet), in the order they
were created (their position in the event log). The rules (docs/reservations.md, "The
queue"):

1. A dispatch pass walks the line in order. A queued reservation is placed at its earliest
   start when its tenant's quota allows it and a node can hold it; a movable one moves to an
   earlier start when one is free.
2. The *head* is the first queued reservation of the walk that could not be placed. Its
   *shadow* is where it would start: the earliest start at or after the instant its own
   tenant's reservations, ending as booked, leave room in its quota.
3. Behind the head, a placement or a move is made only when it does not delay the head
   (``delays_head``): its booking leaves the head's shadow slot whole, and, for the head's
   own tenant, it does not push the head's quota instant past the shadow's start. After
   each one the shadow accounts for it (``Shadow.after``), so several that each fit alone
   cannot delay the head together.
4. A head without a shadow (no node of the pool could ever hold it) cannot be delayed.

The same check guards a new reservation made while the pool has a queue.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from better_compute.domain.durations import parse_duration
from better_compute.domain.earliest import Booking, Slot, Timeline, fits_at, quota_free_at
from better_compute.domain.errors import InvalidInput
from better_compute.domain.placement import PlacementRequest

DEFAULT_QUEUE_TIMEOUT = timedelta(hours=6)
MIN_QUEUE_TIMEOUT = timedelta(seconds=1)
MAX_QUEUE_TIMEOUT = timedelta(days=7)
EARLIEST = "earliest"


@dataclass(frozen=True)
class StartMode:
    """How a create places: at a start (default now), at the earliest start, or queued."""

    start: str | None  # +2h or RFC 3339 for a fixed start; None: now (or the earliest)
    earliest: bool = False
    queue: bool = False
    queue_timeout: timedelta = DEFAULT_QUEUE_TIMEOUT
    move_earlier: bool = False

    def fingerprint(self) -> dict[str, object]:
        """What a retry with the same key must repeat (only what was asked for)."""
        out: dict[str, object] = {}
        if self.earliest:
            out["start"] = EARLIEST
        if self.queue:
            out["queue"] = True
            out["queueTimeout"] = int(self.queue_timeout.total_seconds())
        if self.move_earlier:
            out["moveEarlier"] = True
        return out

    def request_fields(self) -> dict[str, object]:
        """What the reservation's ``request`` remembers of the mode."""
        out: dict[str, object] = {}
        if self.earliest:
            out["start"] = EARLIEST
        if self.queue:
            out["queue"] = True
        if self.earliest or self.move_earlier:
            out["moveEarlier"] = True
        return out


def start_mode(start: str | None, queue: bool, queue_timeout: str | None,
               move_earlier: bool) -> StartMode:
    """The create's mode from its flags; a clear error for combinations that mean nothing."""
    earliest = start == EARLIEST
    if queue and start is not None and not earliest:
        raise InvalidInput(f"--queue starts as early as it can, so it takes no --start {start}: "
                           "drop --start (or write --start earliest)")
    if queue_timeout is not None and not queue:
        raise InvalidInput("--queue-timeout goes with --queue: add --queue")
    if move_earlier and (start is None or earliest or queue):
        raise InvalidInput("--move-earlier is for a reservation with a later --start (+2h or a "
                           "time); --start earliest and --queue move earlier already")
    timeout = DEFAULT_QUEUE_TIMEOUT
    if queue_timeout is not None:
        try:
            timeout = parse_duration(queue_timeout, flag="--queue-timeout")
        except OverflowError:  # more days than a timedelta holds: out of range as well
            timeout = MAX_QUEUE_TIMEOUT * 2
        if not MIN_QUEUE_TIMEOUT <= timeout <= MAX_QUEUE_TIMEOUT:
            raise InvalidInput(f"--queue-timeout {queue_timeout} is out of range: wait 1s to 7d")
    return StartMode(start=None if earliest else start, earliest=earliest or queue,
                     queue=bool(queue), queue_timeout=timeout, move_earlier=bool(move_earlier))


@dataclass(frozen=True)
class Shadow:
    """Where the head of a pool's queue would start, and what that start rests on."""

    reservation_id: str
    tenant_id: str
    request: PlacementRequest
    slot: Slot
    node: Timeline  # the shadow slot's node, with its bookings
    quota_limit: int | None
    quota_held: tuple[tuple[int, float], ...]  # (GPUs, end) of the tenant's live reservations
    now: float

    def after(self, tenant_id: str, node_id: str, booking: Booking, quota_gpus: int,
              releases: str | None = None) -> Shadow:
        """The shadow once ``booking`` is made (and ``releases``, an allocation, is gone)."""
        node = self.node
        if releases is not None:
            node = node.without(releases)
        if node_id == node.node_id:
            node = node.with_booking(booking)
        held = self.quota_held
        if tenant_id == self.tenant_id and quota_gpus:
            held = (*held, (quota_gpus, booking.end))
        return replace(self, node=node, quota_held=held)


def delays_head(shadow: Shadow | None, tenant_id: str, node_id: str, booking: Booking,
                quota_gpus: int, releases: str | None = None) -> bool:
    """Would making ``booking`` (of ``tenant_id``, on ``node_id``) delay the queue's head?

    ``quota_gpus``: the GPUs it takes from its tenant's quota (0 for a move); ``releases``: the
    allocation a move gives up. Conservative on the shadow's node: a booking there that
    leaves the head unable to start at the shadow's start delays it, even if another node
    could take the head at that instant.
    """
    if shadow is None:
        return False
    if tenant_id == shadow.tenant_id and quota_gpus:
        held = (*shadow.quota_held, (quota_gpus, booking.end))
        free_at = quota_free_at(shadow.quota_limit, held, shadow.request.gpus, shadow.now)
        if free_at is None or free_at > shadow.slot.start:
            return True
    if node_id != shadow.node.node_id:
        return False
    node = shadow.node.without(releases) if releases is not None else shadow.node
    start, end = shadow.slot.start, shadow.slot.end
    return fits_at(shadow.request, node.with_booking(booking), start, end) is None
