"""Running the controllers inside ``serve``: elected, woken by events and by a tick.

``run_controllers`` is a lifespan task. It tries to become the leader
every ``retry`` seconds; once it leads, it runs a NodeLifecycle pass
whenever the process's event hub reads a node.* or reservation.* event and at least every
``tick`` seconds (the timers), and checks it still holds the lock before
each pass. Each pass also records the API tokens whose end has passed
(``token.expired``, api/tokens.py). A pass that fails is retried on the next tick (logged once per run
of failures: a store outage fails every pass until the store is back). On
PostgreSQL the lock lives on the leader's own connection, so an outage ends
it: every replica tries again every ``retry`` seconds, and one leads again
once the store is back.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import anyio
import anyio.abc

from better_compute.api.actor import (
    CONTROLLER_NODES,
    CONTROLLER_RESERVATIONS,
    CONTROLLER_TOKENS,
    as_actor,
)
from better_compute.api.controllers.leader import Leadership, leadership_for
from better_compute.api.controllers.node_lifecycle import (
    ACCEPTANCE_TIMEOUT,
    UNREACHABLE_AFTER,
    NodeLifecycle,
)
from better_compute.api.controllers.reservations import ReservationTimers
from better_compute.api.eventlog import EventFilter
from better_compute.api.node_presence import Presence
from better_compute.api.node_service import NodeService
from better_compute.api.reservation_service import reservations
from better_compute.api.settings import env_seconds
from better_compute.api.supervise import Retry
from better_compute.api.tokens import TokenExpiry, TokenService
from better_compute.domain.events import compile_type_filter

log = logging.getLogger("better_compute.controllers")

# The controllers react to node and reservation events only; anything else (a site
# created, a token minted, a heartbeat summary) waits for the next tick.
_WAKE_ON = EventFilter(types=compile_type_filter(["node.*", "reservation.*"]))


def unreachable_after(env: Any) -> timedelta:
    seconds = env_seconds(env, "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER",
                       UNREACHABLE_AFTER.total_seconds())
    return timedelta(seconds=seconds)


def acceptance_timeout(env: Any) -> timedelta:
    seconds = env_seconds(env, "BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT",
                       ACCEPTANCE_TIMEOUT.total_seconds())
    return timedelta(seconds=seconds)


def lifecycle_for(runtime: Any) -> NodeLifecycle:
    return NodeLifecycle(NodeService(runtime.service), Presence(runtime.store.sql()),
                         unreachable_after(runtime.env), acceptance_timeout(runtime.env))


async def run_controllers(state: Any, *, leadership: Leadership | None = None,
                          task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                          ) -> None:
    runtime = state.runtime
    env = runtime.env
    tick = env_seconds(env, "BETTER_COMPUTE_CONTROLLER_TICK", 1.0)
    retry = env_seconds(env, "BETTER_COMPUTE_CONTROLLER_RETRY", 1.0)
    lead = leadership or leadership_for(runtime)
    lifecycle = await anyio.to_thread.run_sync(lifecycle_for, runtime)
    timers = ReservationTimers(reservations(runtime.service))
    expiry = TokenExpiry(TokenService(runtime.service))
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
            state.extra["controllers_leader"] = True
            while await anyio.to_thread.run_sync(lead.still_leader, limiter=limiter):
                position = hub.head if hub is not None else 0
                for name, actor, work in (
                        ("lifecycle", CONTROLLER_NODES, lifecycle.reconcile),
                        ("timers", CONTROLLER_RESERVATIONS, timers.tick),
                        ("tokens", CONTROLLER_TOKENS, expiry.tick)):
                    try:
                        await anyio.to_thread.run_sync(as_actor(actor, work), limiter=limiter)
                    except Exception as exc:  # retried on the next tick
                        passes[name].failed(exc)
                    else:
                        passes[name].succeeded()
                if hub is not None:
                    await hub.wait_beyond(position, tick, _WAKE_ON)
                else:
                    await anyio.sleep(tick)
            state.extra["controllers_leader"] = False
            lifecycle.lost_sight()
            log.warning("lost the controllers' lock; trying to take it again")
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lead.release, limiter=limiter)
