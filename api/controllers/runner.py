"""Running the controllers inside ``serve``: elected, woken by events and by a tick.

``run_controllers`` is a lifespan task. It tries to become the leader
every ``retry`` seconds; once it leads, it runs four loops side by side, each
woken by the events it acts on and at least every ``tick`` seconds: the
NodeLifecycle and tokens passes (node sessions and acceptance, pool.* events), the
reservation timers (what another hand made due: reservation.dequeued, .replaced and
.rescheduled; a create that starts now binds in its own save) and the queue dispatcher (the
node.*, reservation.*, bookings.*, quota.* and pool.* events that can free capacity or add to
a line), so a burst of creates wakes none of them. (The read models are followed by every
process's own follower: projections/framework.py ``Follower``.) Each loop checks it still
holds the lock before each pass. A loop woken by an event runs at once when
its last pass began ``settle`` seconds ago or more (BETTER_COMPUTE_CONTROLLER_SETTLE, default
0.2 s), else waits until then: under a stream of creates a pass handles many at once instead
of running once per create in the process that serves them. Each pass
also records the API tokens whose end has passed (``token.expired``, api/services/tokens.py).
A pass that fails is retried on the next tick (logged once per run of failures: a store
outage fails every pass until the store is back). On
PostgreSQL the lock lives on the leader's own connection, so an outage ends
it: every replica tries again every ``retry`` seconds, and one leads again
once the store is back.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc

from better_compute.api.controllers.leader import Leadership, leadership_for
from better_compute.api.controllers.node_lifecycle import (
    ACCEPTANCE_TIMEOUT,
    UNREACHABLE_AFTER,
    NodeLifecycle,
)
from better_compute.api.controllers.queue import QueueDispatcher
from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.services.tokens import TokenExpiry
from better_compute.api.settings import env_seconds
from better_compute.api.store.eventlog import EventFilter
from better_compute.api.store.node_presence import Presence
from better_compute.api.supervise import Retry
from better_compute.domain.events import compile_type_filter

log = logging.getLogger("better_compute.controllers")

# The queue dispatcher reacts to node, reservation, booking, quota and pool events that can
# free GPUs or quota or add to a line; anything else (a site created, a token minted, a
# heartbeat summary) waits for the next tick. Events that only take or keep capacity (what
# every create and its binding write) wake nothing: under a stream of creates a pass they
# woke found nothing new to place and cost ~6 % of the server's CPU per create. An event type
# not named here wakes it (tests/unit/test_controller_wakes.py sorts every type).
_TAKES_ONLY = (
    "reservation.placed", "reservation.binding", "reservation.active", "reservation.extended",
    "reservation.dequeued", "bookings.opened", "bookings.booked", "bookings.extended",
    "quota.opened", "quota.taken", "node.devices.assigned", "node.devices.unassigned",
    "node.joined", "node.cordoned", "node.draining", "node.drained", "node.gpu.unhealthy",
    "node.disconnected", "node.unreachable", "node.removed", "node.certificate.renewed",
    "node.acceptance.started", "node.acceptance.failed", "node.inventory.mismatch",
)


def _wakes_but(globs: list[str], quiet: tuple[str, ...]) -> EventFilter:
    """The types ``globs`` match, except the exact types in ``quiet``."""
    broad = compile_type_filter(globs)
    assert broad is not None
    skip = "|".join(re.escape(t) for t in quiet)
    return EventFilter(types=re.compile(f"(?!(?:{skip})\\Z)(?:{broad.pattern})"))


_WAKE_ON = _wakes_but(["node.*", "reservation.*", "bookings.*", "quota.*", "pool.*"],
                      _TAKES_ONLY)
# The NodeLifecycle pass reads node sessions and acceptance (node.*, and a pool's checks);
# the timers act on reservations; the tokens pass on time alone.
# (not node.devices.*: every reservation's binding and end write those; the tick still runs
# the pass every second whatever happened).
_WAKE_NODES = EventFilter(types=compile_type_filter([
    "node.joined", "node.rejoined", "node.connected", "node.disconnected", "node.unreachable",
    "node.acceptance.*", "node.adopted", "node.removed", "pool.*"]))
# The timers bind what became due by another's hand (the queue placed it, a failed hold was
# placed again, it was moved earlier); a create that starts now binds in its own save, and a
# later start or an end time is the tick's.
_WAKE_TIMERS = EventFilter(types=compile_type_filter([
    "reservation.dequeued", "reservation.replaced", "reservation.rescheduled"]))
SETTLE = 0.2  # seconds: the least time between the starts of two passes woken by events


def unreachable_after(env: Any) -> timedelta:
    seconds = env_seconds(env, "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER",
                       UNREACHABLE_AFTER.total_seconds())
    return timedelta(seconds=seconds)


def acceptance_timeout(env: Any) -> timedelta:
    seconds = env_seconds(env, "BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT",
                       ACCEPTANCE_TIMEOUT.total_seconds())
    return timedelta(seconds=seconds)


def lifecycle_for(runtime: Any) -> NodeLifecycle:
    return NodeLifecycle(runtime.services.nodes, Presence(runtime.store.sql()),
                         unreachable_after(runtime.env), acceptance_timeout(runtime.env))


async def run_controllers(state: Any, *, leadership: Leadership | None = None,
                          task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                          ) -> None:
    runtime = state.runtime
    env = runtime.env
    tick = env_seconds(env, "BETTER_COMPUTE_CONTROLLER_TICK", 1.0)
    settle = min(tick, env_seconds(env, "BETTER_COMPUTE_CONTROLLER_SETTLE", SETTLE))
    retry = env_seconds(env, "BETTER_COMPUTE_CONTROLLER_RETRY", 1.0)
    lead = leadership or leadership_for(runtime)
    lifecycle = await anyio.to_thread.run_sync(lifecycle_for, runtime)
    timers = ReservationTimers(runtime.services.reservations)
    expiry = TokenExpiry(runtime.services.tokens)
    dispatcher = QueueDispatcher(runtime.services.reservations)
    hub = state.extra.get("watch_hub")
    limiter = anyio.CapacityLimiter(1)
    passes = {"lifecycle": Retry("a NodeLifecycle pass", log),
              "timers": Retry("a reservations pass", log),
              "tokens": Retry("a tokens pass", log)}
    task_status.started()
    try:
        while True:
            if not await anyio.to_thread.run_sync(lead.try_acquire, limiter=limiter):
                await anyio.sleep(retry)
                continue
            log.info("this process runs the controllers")
            # Silence before this leader's first pass does not count: it was not watching.
            # Another replica led, or none did while the store was away (its gateways could
            # not write heartbeats): nodes heard of last then are not unreachable for that.
            lifecycle.lost_sight()
            state.extra["controllers_leader"] = True
            async with anyio.create_task_group() as dispatching:
                dispatching.start_soon(_dispatch, dispatcher, hub, tick, settle)
                dispatching.start_soon(_lead, None, passes, (  # leadership checked below
                    ("timers", timers.tick),), hub, tick, settle,
                    anyio.CapacityLimiter(1), _WAKE_TIMERS)
                await _lead(lead, passes, (
                    ("lifecycle", lifecycle.reconcile),
                    ("tokens", expiry.tick)), hub, tick, settle, limiter,
                    _WAKE_NODES)
                dispatching.cancel_scope.cancel()
            state.extra["controllers_leader"] = False
            lifecycle.lost_sight()
            log.warning("lost the controllers' lock; trying to take it again")
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lead.release, limiter=limiter)


async def _wait(hub: Any, position: int, tick: float, flt: EventFilter, began: float,
                settle: float) -> None:
    """Until the hub reads an event ``flt`` lets through after ``position`` (or ``tick``
    passes), and at least ``settle`` seconds after the last pass ``began``."""
    if hub is None:
        await anyio.sleep(tick)
        return
    await hub.wait_beyond(position, tick, flt)
    pause = began + settle - time.monotonic()
    if pause > 0:
        await anyio.sleep(pause)


async def _dispatch(dispatcher: QueueDispatcher, hub: Any, tick: float, settle: float) -> None:
    """The queue dispatcher's own loop, beside the others: a release is not kept waiting by
    a NodeLifecycle or timers pass (only the leader runs it; cancelled with leadership)."""
    limiter = anyio.CapacityLimiter(1)
    retry = Retry("a queue dispatch pass", log)
    while True:
        position = hub.head if hub is not None else 0
        began = time.monotonic()
        try:
            await anyio.to_thread.run_sync(dispatcher.run, limiter=limiter)
        except Exception as exc:  # retried on the next wake or tick
            retry.failed(exc)
        else:
            retry.succeeded()
        await _wait(hub, position, tick, _WAKE_ON, began, settle)


async def _lead(lead: Leadership | None, passes: dict[str, Retry],
                work: tuple[tuple[str, Callable[[], Any]], ...], hub: Any,
                tick: float, settle: float, limiter: anyio.CapacityLimiter,
                wake_on: EventFilter) -> None:
    """Passes of ``work`` (NodeLifecycle and tokens, or the timers), while this process holds
    the lock (checked before each pass when ``lead`` is given; else the caller cancels)."""
    while lead is None or await anyio.to_thread.run_sync(lead.still_leader, limiter=limiter):
        position = hub.head if hub is not None else 0
        began = time.monotonic()
        for name, run in work:
            try:
                await anyio.to_thread.run_sync(run, limiter=limiter)
            except Exception as exc:  # retried on the next tick
                passes[name].failed(exc)
            else:
                passes[name].succeeded()
        await _wait(hub, position, tick, wake_on, began, settle)
