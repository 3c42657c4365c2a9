"""Supervision of the server's background work: retry with backoff instead of dying.

A lifespan task (the gateway, the controllers) that fails after it started is logged
and started again after a growing delay; one that fails before it started fails the
server's start-up (a port in use, a bad setting: the operator must see it). Nothing a
task raises ends the lifespan's task group, so nothing closes the store while uvicorn
serves.

``Retry`` is the backoff of a loop that keeps trying one thing (a flush, a follower):
the delay grows from ``first`` to ``cap``; the first failure of a run of failures is
logged (one line for a store outage, a traceback for anything else), the others only
when they fail differently, and the first success after them says how long it took.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import anyio.abc

from better_compute.api.store.outage import outage_reason

log = logging.getLogger("better_compute.supervise")

HEALTHY_RUN = 60.0  # seconds: a task that ran this long starts again at the shortest delay


class Retry:
    def __init__(self, what: str, logger: logging.Logger, *, first: float = 0.1,
                 cap: float = 2.0) -> None:
        self.what = what
        self.log = logger
        self.first = first
        self.cap = cap
        self.failures = 0
        self._since = 0.0
        self._last = ""

    def failed(self, exc: BaseException) -> float:
        """Count one failure; returns the delay before the next attempt."""
        reason = outage_reason(exc)
        kind = reason or f"{type(exc).__name__}: {exc}"
        if self.failures == 0:
            self._since = time.monotonic()
        if self.failures == 0 or kind != self._last:
            if reason is not None:
                self.log.warning("%s failed (the event store is unavailable: %s); retrying",
                                 self.what, reason)
            else:
                self.log.error("%s failed; retrying", self.what, exc_info=exc)
        self._last = kind
        delay = min(self.cap, self.first * 2 ** min(self.failures, 20))
        self.failures += 1
        return float(delay)

    def succeeded(self) -> None:
        if self.failures:
            self.log.warning("%s works again after %d failures in %.1fs", self.what,
                             self.failures, time.monotonic() - self._since)
            self.failures = 0


class _StartedOnce:
    """Hands the first ``started`` to the task group; later runs' calls are no-ops."""

    def __init__(self, status: anyio.abc.TaskStatus[Any]) -> None:
        self.status = status
        self.done = False

    def started(self, value: Any = None) -> None:
        if not self.done:
            self.done = True
            self.status.started(value)


async def supervised(task: Any, state: Any, *,
                     task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
                     ) -> None:
    """Run ``task(state, task_status=…)`` for the life of the server, restarting it on
    failure with a delay from 0.5 s up to 10 s (started with ``tg.start``)."""
    name = getattr(task, "__qualname__", repr(task))
    status = _StartedOnce(task_status)
    retry = Retry(f"the background task {name}", log, first=0.5, cap=10.0)
    while True:
        began = time.monotonic()
        try:
            await task(state, task_status=status)
        except Exception as exc:
            if not status.done:
                raise  # it never started: the server must not start either
            if time.monotonic() - began >= HEALTHY_RUN:
                retry.failures = 0
            delay = retry.failed(exc)
        else:
            return  # a task that ends on its own is done
        log.warning("starting %s again in %.1fs (failure %d in a row)", name, delay,
                    retry.failures)
        await anyio.sleep(delay)
