"""Aggregates: the one way every service reads and writes aggregates.

Every service of api/services/ is built over ONE ``Aggregates`` (by the composition root,
api/runtime.py) and uses only its public names:

- ``get(cls, uuid)``: the aggregate, or None when there is none of that class;
- ``save(*aggregates, actor=...)``: ONE atomic save; a version clash is ``Conflict``;
- ``retrying(change, actor=...)``: the optimistic-concurrency retry policy (below);
- ``create_once(...)``: create per idempotency key; a retry returns the first object;
- ``scope(principal, tenant_id)`` and ``tenant(tenant_id)``: the tenant a call acts on;
- ``listing(kind, ...)``: the listings projection, caught up first (read your own writes);
- ``now()``: database time (PostgreSQL's ``now()``, so every replica books on one clock).

The retry policy: a command that read aggregates, decided and saved them may lose the race
with another writer of the same aggregates (the store refuses a save whose versions moved:
``IntegrityError``). ``retrying`` then runs the whole change again, re-reading what it
changes, after a pause with full jitter (``retry_pause``), until it has run
``RETRY_ATTEMPTS`` times and ``RETRY_WITHIN_S`` seconds have passed since its first run;
past both the caller gets ``Conflict`` and nothing was saved. The seconds matter where an
aggregate is in demand on a loaded machine (a tenant's quota, saved by every create and
release of its reservations from every replica): twenty runs can pass in a second there.
Every retry loop of the services uses this policy.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError
from eventsourcing.persistence import IntegrityError

from better_compute.domain.access import Principal
from better_compute.domain.base import TenantOwned
from better_compute.domain.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from better_compute.domain.ids import check_tenant_id
from better_compute.domain.tenant import Tenant, tenant_uuid
from better_compute.projections.listings import (
    ended_tokens,
    live_tokens,
    next_token_end,
    query_listing,
)

A = TypeVar("A", bound=TenantOwned)
Clock = Callable[[], datetime]

RETRY_ATTEMPTS = 20  # runs of a change before its caller may get Conflict (see above)
RETRY_WITHIN_S = 10.0  # seconds from a change's first run before its caller may get Conflict
RETRY_PAUSE_CAP = 0.05  # seconds: the longest pause between two runs of a change


def retry_pause(clashes: int) -> float:
    """The pause after a change's ``clashes``-th clash in a row (0 first): full jitter,
    uniform in [0, min(RETRY_PAUSE_CAP, 2 ms x 2^clashes)]. Writers that clashed on one
    aggregate (a node's bookings, saved by every create and release on it, from several
    replicas) do not run again in step, so none loses every run."""
    return random.uniform(0.0, min(RETRY_PAUSE_CAP, 0.002 * 2 ** min(clashes, 10)))


CONFLICT = ("another request changed the same objects at the same time; nothing was saved: "
            "run the command again")


@dataclass(frozen=True)
class Also:
    """What a change of one aggregate answers, and the other aggregates it changed, to save
    in the same write (``NodeService.change_each``: a node's adoption and its GPU claims)."""

    answer: Any
    others: Sequence[Any]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Aggregates:
    """The store's aggregates, the listings and the clock, shared by every service."""

    def __init__(self, store: Any, projections: Any, clock: Clock = utc_now) -> None:
        self.store = store
        self.projections = projections
        self.sql = projections.sql
        self.clock = clock

    def get(self, cls: type[A], uuid: UUID, *, fresh: bool = True) -> A | None:
        """The aggregate, or None. ``fresh=False`` for one the caller saves: as this process
        last saw it, with no read (the store refuses the save of a stale one, and the retry
        reads it)."""
        try:
            aggregate = self.store.load(uuid, fresh=fresh)
        except AggregateNotFoundError:
            return None
        return aggregate if isinstance(aggregate, cls) else None

    def get_each(self, cls: type[A], uuids: Sequence[UUID]) -> dict[UUID, A]:
        """The aggregates of ``uuids`` that exist and are of ``cls``, read together
        (``ComputeStore.load_each``)."""
        return {u: a for u, a in self.store.load_each(uuids).items() if isinstance(a, cls)}

    def stored(self, uuids: Sequence[UUID]) -> set[UUID]:
        """Which of ``uuids`` have events in the store (of any class), in one query: where
        most are new (a fleet's GPU claims at its adoption), ``get`` of each would be two
        round trips per missing one (its snapshot, its events)."""
        if not uuids:
            return set()
        sql = self.sql
        with sql.transaction(commit=False) as cursor:
            if sql.postgres:
                table = self.store.recorder.events_table_name
                cursor.execute(f"SELECT DISTINCT originator_id FROM {table} "
                               "WHERE originator_id = ANY(%s)", (list(uuids),))
                return {UUID(str(row["originator_id"])) for row in cursor.fetchall()}
            marks = ",".join("?" * len(uuids))
            cursor.execute(f"SELECT DISTINCT originator_id FROM stored_events "
                           f"WHERE originator_id IN ({marks})", tuple(u.hex for u in uuids))
            return {UUID(hex=str(row["originator_id"])) for row in cursor.fetchall()}

    def save(self, *aggregates: TenantOwned, actor: str, conflict: str = CONFLICT) -> None:
        """One atomic save of ``aggregates``' events, each stamped with ``actor`` (who did it:
        api/store/actor.py)."""
        try:
            self.store.save(*aggregates, actor=actor)
        except IntegrityError:
            raise Conflict(conflict) from None

    def retrying(self, change: Callable[[], list[TenantOwned]], *, actor: str,
                 conflict: str = CONFLICT) -> None:
        """Run ``change`` (which re-reads what it changes) and save what it returns; run it
        again on a version clash until ``RETRY_ATTEMPTS`` runs and ``RETRY_WITHIN_S`` seconds
        are both spent. Nothing to save: done."""
        give_up = time.monotonic() + RETRY_WITHIN_S
        attempt = 0
        while True:
            aggregates = change()
            if not aggregates:
                return
            try:
                self.store.save(*aggregates, actor=actor)
                return
            except IntegrityError:
                attempt += 1
                if attempt >= RETRY_ATTEMPTS and time.monotonic() >= give_up:
                    raise Conflict(conflict) from None
                time.sleep(retry_pause(attempt - 1))

    def create_once(self, cls: type[A], make: Callable[[], A], *, key: str | None, fp: str,
                    what: str, actor: str) -> A:
        """Create once per idempotency key: a retry returns the first object."""
        aggregate = make()
        if key:
            existing = self.get(cls, aggregate.id)
            if existing is not None:
                existing.check_retry(fp, what, key)
                return existing
        try:
            self.store.save(aggregate, actor=actor)
        except IntegrityError:
            existing = self.get(cls, aggregate.id)
            if existing is None:
                raise
            existing.check_retry(fp, what, key)
            return existing
        return aggregate

    def scope(self, principal: Principal, tenant_id: str | None) -> str:
        """The tenant a call acts on: the caller's own unless a root caller names another."""
        if tenant_id:
            check_tenant_id(tenant_id)
        tenant = tenant_id or principal.tenant_id
        principal.require_can_act_on(tenant)
        return tenant

    def listed_tenant(self, principal: Principal, tenant_id: str | None, all_tenants: bool,
                      what: str) -> str | None:
        """The tenant a list method lists: ``scope``'s, or None for every tenant's when
        ``all_tenants`` (``allTenants``, the CLI's -A), which only root-tenant callers may ask."""
        if not all_tenants:
            return self.scope(principal, tenant_id)
        if tenant_id:
            raise InvalidInput(f"allTenants lists every tenant's {what}: give it or tenantId, "
                               "not both (-A or --tenant)")
        if not principal.is_root:
            raise PermissionDenied(
                f"only root-tenant tokens list every tenant's {what} (allTenants, -A/"
                f"--all-tenants); this token is tenant {principal.tenant_id}'s: leave out -A to "
                f"list its own {what}")
        return None

    def tenant(self, tenant_id: str) -> Tenant:
        check_tenant_id(tenant_id)
        tenant = self.get(Tenant, tenant_uuid(tenant_id))
        if tenant is None:
            raise NotFound(
                f"no tenant {tenant_id!r}: create it first with "
                f"`better-compute tenants create {tenant_id}`"
            )
        return tenant

    def listing(self, kind: str, **filters: Any) -> list[dict[str, Any]]:
        self.projections.catch_up("listings")
        return query_listing(self.sql, kind, **filters)

    def live_tokens(self, tenant_id: str, now: datetime) -> int:
        """The tenant's live API tokens at ``now``, counted without reading the others."""
        self.projections.catch_up("listings")
        return live_tokens(self.sql, tenant_id, now)

    def ended_tokens(self, now: datetime) -> list[UUID]:
        """The API tokens still recorded live whose end has passed at ``now`` (the tokens
        controller's pass: the listings as this process follows them)."""
        self.projections.followed("listings")
        return [UUID(each) for each in ended_tokens(self.sql, now)]

    def next_token_end(self) -> datetime | None:
        """The earliest end of an API token still recorded live."""
        self.projections.followed("listings")
        return next_token_end(self.sql)

    def now(self) -> datetime:
        """Database time: PostgreSQL's ``now()``, so every replica books on one clock; on
        SQLite, which lives on one machine, the process clock. An injected clock (tests)
        wins."""
        if self.clock is not utc_now or not self.sql.postgres:
            return self.clock()
        with self.sql.transaction(commit=False) as cursor:
            cursor.execute("SELECT now() AS now")
            value: datetime = cursor.fetchone()["now"]
        return value.astimezone(UTC)
