"""Accepting a node (docs/nodes.md, "Acceptance"): its commands and their events.

Acceptance runs in attempts (``node.acceptance.started``): the controller starts the first,
``nodes.adopt`` the next after a failure. A verdict on the running attempt adopts the node
(``node.adopted``, at desired-state generation 1 or the next one for a node that joined
again) or fails it (``node.acceptance.failed``, sticky); an attempt with no verdict in time
fails with reason ``timeout``; a result that lists other GPUs than the node's fails it with
reason ``inventory`` (domain/node_inventory.py).

These are methods of ``Node``, assigned in its class body (domain/node.py), like the ones of
domain/node_retirement.py: each public one decides, each ``@event`` body only assigns.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from eventsourcing.domain import event

from better_compute.domain.errors import Conflict
from better_compute.domain.node_rules import (
    ACCEPTANCE_FAILED,
    ACCEPTANCE_PASSED,
    ACCEPTANCE_RUNNING,
    PROVISION_ADOPTED,
)

if TYPE_CHECKING:
    from better_compute.domain.node import Node

ADOPTED_GENERATION = 1  # the desired-state generation a node gets when it is adopted


def start_acceptance(self: Node, at: datetime, checks: list[dict[str, Any]], reason: str,
                     requested_by: str | None) -> int:
    """Start the next acceptance attempt (the controller, or nodes.adopt after a failure)."""
    if self.removed:
        raise Conflict(f"node {self.public_id} was removed: the machine joins again with "
                       "bcd join, then its acceptance starts")
    if self.adopted:
        raise Conflict(
            f"node {self.public_id} is already adopted (attempt {self.acceptance_attempt} "
            "passed): there is nothing to accept"
        )
    if self.acceptance_state == ACCEPTANCE_RUNNING:
        raise Conflict(
            f"acceptance attempt {self.acceptance_attempt} of node {self.public_id} is still "
            "running: wait for its result (`better-compute nodes events NODE`)"
        )
    attempt = self.acceptance_attempt + 1
    self._acceptance_started(attempt=attempt, generation=self.generation, checks=checks,
                             reason=reason, requested_by=requested_by, at=at)
    return attempt


@event("AcceptanceStarted", topic="node.acceptance.started")
def _acceptance_started(self: Node, attempt: int, generation: int, checks: list[dict[str, Any]],
                        reason: str, requested_by: str | None, at: datetime) -> None:
    self.acceptance_state = ACCEPTANCE_RUNNING
    self.acceptance_attempt = attempt
    self.acceptance_checks = checks
    self.acceptance_results = []
    self.acceptance_message = reason
    self.acceptance_since = at
    self._touch(at)


def time_out_acceptance(self: Node, attempt: int, at: datetime, after: timedelta) -> bool:
    """The running ``attempt`` got no verdict within ``after``: failed, reason ``timeout``.

    False when that attempt is no longer running (a verdict, or another attempt, came
    first) or has not run for ``after`` yet. Sticky like any failure: nodes.adopt
    starts the next attempt.
    """
    if attempt != self.acceptance_attempt or self.acceptance_state != ACCEPTANCE_RUNNING \
            or self.removed:
        return False
    since = self.acceptance_since
    if since is not None and at - since < after:
        return False
    seconds = int(after.total_seconds())
    message = (f"no acceptance result within {seconds}s: is bcd node running on the "
               "machine and connected? (`bcd status`); then run nodes.adopt")
    self._acceptance_failed(attempt=attempt, message=message, results=[], at=at,
                            reason="timeout")
    return True


def finish_acceptance(self: Node, attempt: int, passed: bool, message: str,
                      results: list[dict[str, Any]], gpus: list[dict[str, Any]] | None,
                      at: datetime) -> bool:
    """Record the verdict on a running attempt; False for any other attempt (stale)."""
    if attempt != self.acceptance_attempt or self.acceptance_state != ACCEPTANCE_RUNNING:
        return False
    if passed:  # generation 1, or the next one for a node that joined again
        generation = max(ADOPTED_GENERATION, self.generation + 1)
        self._adopted(attempt=attempt, generation=generation, results=results,
                      gpus=gpus if gpus is not None else self.gpus, at=at)
    else:
        self._acceptance_failed(attempt=attempt, message=message, results=results, at=at,
                                reason="checks")
    return True


def refuse_acceptance(self: Node, attempt: int, message: str, at: datetime) -> bool:
    """The running ``attempt``'s result listed other GPUs than the node's
    (domain/node_inventory.py): failed, reason ``inventory``; False for any other attempt."""
    if attempt != self.acceptance_attempt or self.acceptance_state != ACCEPTANCE_RUNNING:
        return False
    self._acceptance_failed(attempt=attempt, message=message, results=[], at=at,
                            reason="inventory")
    return True


@event("Adopted", topic="node.adopted")
def _adopted(self: Node, attempt: int, generation: int, results: list[dict[str, Any]],
             gpus: list[dict[str, Any]], at: datetime) -> None:
    self.provision_state = PROVISION_ADOPTED
    self.acceptance_state = ACCEPTANCE_PASSED
    self.acceptance_results = results
    self.acceptance_message = "every acceptance check passed"
    self.acceptance_since = at
    self.generation = generation
    self.gpus = gpus
    self.adopted_at = at
    self._touch(at)


@event("AcceptanceFailed", topic="node.acceptance.failed")
def _acceptance_failed(self: Node, attempt: int, message: str, results: list[dict[str, Any]],
                       at: datetime, reason: str = "checks") -> None:
    # ``reason``: ``checks`` (the verdict failed), ``timeout`` (no verdict in time) or
    # ``inventory`` (the result listed other GPUs); events stored before it existed replay
    # as ``checks``.
    self.acceptance_state = ACCEPTANCE_FAILED
    self.acceptance_failure = reason
    self.acceptance_results = results
    self.acceptance_message = message
    self.acceptance_since = at
    self._touch(at)
