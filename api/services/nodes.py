"""nodes.* and capacity.get, and the commands the gateway and the controller give nodes.

Operator commands take a Principal and check its tenant. Internal commands
(sessions, acceptance, health, timers) come from the gateway, which has
verified the node's certificate and signatures, or from the NodeLifecycle
controller; each re-reads the node, decides with the service's clock, and
ends in one save, retried a few times when another writer got there first.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast
from uuid import UUID

import msgspec
from eventsourcing.persistence import IntegrityError, Notification

from better_compute.api.services.compute import ComputeService
from better_compute.api.services.inventory import release_all
from better_compute.api.services.unit import RETRY_ATTEMPTS, Also
from better_compute.api.store.actor import stamp
from better_compute.api.store.eventlog import render
from better_compute.api.store.node_presence import Presence, Reports
from better_compute.domain.access import Principal
from better_compute.domain.base import TenantOwned, iso
from better_compute.domain.bookings import NodeBookings, bookings_uuid
from better_compute.domain.durations import format_duration, parse_duration
from better_compute.domain.errors import Conflict, InvalidInput, NotFound
from better_compute.domain.gpus import Gpu
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from better_compute.domain.node_rules import (
    ACCEPTANCE_PENDING,
    PROVISION_REMOVED,
    acceptance_checks,
)
from better_compute.domain.policy import node_sections
from better_compute.domain.pool import Pool
from better_compute.domain.quota import QuotaUse, quota_uuid
from better_compute.domain.reservation import Reservation
from better_compute.domain.text import MAX_REASON, check_text
from better_compute.projections.capacity import capacity_resources, count_nodes, read_capacity
from better_compute.projections.capacity_history import BUCKET_S, MAX_WINDOW_S, read_history

T = TypeVar("T")
# A change of one node and who makes it (its events' actor): ``NodeService.change_each``.
NodeChangeBy = tuple[UUID, Callable[[Node], Any], str]
HISTORY_MIN = timedelta(seconds=12 * BUCKET_S)  # 1h
HISTORY_MAX = timedelta(seconds=MAX_WINDOW_S)  # 7d
BATCH = 500  # node changes in one write at most (``change_each``)



def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _reason(text: str | None, what: str) -> str:
    return check_text((text or "").strip(), f"the {what} reason", MAX_REASON)


class NodeService:
    """Nodes and capacity on top of the ComputeService's store, projections and clock."""

    def __init__(self, service: ComputeService) -> None:
        self.service = service

    @property
    def clock(self) -> Callable[[], datetime]:
        return self.service.clock

    # ----------------------------------------------------------------- helpers

    def load(self, uuid: UUID) -> Node | None:
        return self.service.aggregates.get(Node, uuid)

    def load_each(self, uuids: Sequence[UUID]) -> dict[UUID, Node]:
        """The nodes of ``uuids`` that exist, read together (``ComputeStore.load_each``)."""
        return self.service.aggregates.get_each(Node, uuids)

    def _node(self, principal: Principal, node_id: str) -> Node:
        node = self.load(parse_id("node", node_id))
        if node is None or not principal.can_see_tenant(node.tenant_id):
            raise NotFound(f"no node {node_id!r}: `better-compute nodes list` shows your nodes")
        return node

    def _pool(self, pool_id: str) -> Pool:
        pool = self.service.aggregates.get(Pool, parse_id("pool", pool_id))
        if pool is None:
            raise NotFound(f"pool {pool_id} is gone")
        return pool

    def pool_sections(self, node: Node) -> dict[str, Any]:
        """The desired-state sections the node's pool policy adds (``kubernetes``, ``profile``)."""
        pool = self.service.aggregates.get(Pool, parse_id("pool", node.pool_id))
        return node_sections(pool.policy) if pool is not None else {}

    def _change(self, uuid: UUID, change: Callable[[Node], T], *, actor: str
                ) -> tuple[Node, T]:
        """Load, change, save as ``actor``; again on a version clash (another writer got
        there first)."""
        for _ in range(RETRY_ATTEMPTS):
            node = self.load(uuid)
            if node is None:
                raise NotFound(f"no node with id {uuid}")
            result = change(node)
            if not node.pending_events:
                return node, result
            try:
                self.service.store.save(node, actor=actor)
            except IntegrityError:
                continue
            return node, result
        raise Conflict("the node kept changing while this change was being saved: try again")

    def change_each(self, changes: Sequence[NodeChangeBy]) -> builtins.list[Any]:
        """Each change applied to its node, its events stamped with the change's actor (who
        did it: the node of a gateway session, a controller), and what they changed saved in
        one write per ``BATCH`` changes: what each change returned, or the error it raised,
        in its place (a missing node: ``NotFound``). A change that also changes other
        aggregates (the GPU claims an adoption takes) returns them with its answer as
        ``Also``; they are saved, stamped alike, in the same write. A node named more than once takes its changes in order. When
        another writer saved one of a write's aggregates first (a version clash), each
        change of that write runs again alone (``_change_alone``), as it would have without
        the batch.

        The gateway's sessions and the NodeLifecycle controller give their changes here a
        batch at a time: a fleet's connects, acceptance attempts and verdicts are one write
        per batch, not one per node (docs/performance.md, "A fleet on one server"). A write
        holds SQLite's one writer for its length, so it stays a few hundred nodes long."""
        results: builtins.list[Any] = []
        for start in range(0, len(changes), BATCH):
            results.extend(self._change_batch(changes[start:start + BATCH]))
        return results

    def _change_batch(self, changes: Sequence[NodeChangeBy]) -> builtins.list[Any]:
        nodes: dict[UUID, Node] = {}
        others: builtins.list[Any] = []
        results: builtins.list[Any] = []
        loaded = self.load_each([uuid for uuid, _, _ in changes])
        for uuid, change, actor in changes:
            node = nodes.get(uuid) or loaded.get(uuid)
            if node is None:
                results.append(NotFound(f"no node with id {uuid}"))
                continue
            nodes[uuid] = node
            made = len(node.pending_events)
            try:
                result = change(node)
            except Exception as exc:  # decided before any event: nothing of it to save
                results.append(exc)
                continue
            finally:
                stamp(node.pending_events[made:], actor)
            if isinstance(result, Also):
                for other in result.others:
                    stamp(other.pending_events, actor)
                others.extend(result.others)
                result = result.answer
            results.append(result)
        changed = [*(n for n in nodes.values() if n.pending_events), *others]
        if not changed:
            return results
        try:
            self.service.store.save(*changed, actor=None)  # each event stamped above
        except IntegrityError:  # two of them claimed the same GPU, say: each alone
            return [self._change_alone(uuid, change, actor) for uuid, change, actor in changes]
        return results

    def _change_alone(self, uuid: UUID, change: Callable[[Node], Any], actor: str) -> Any:
        """``change`` on its node, and saved; again on a version clash: its answer, or the
        error it raised."""
        for _ in range(RETRY_ATTEMPTS):
            node = self.load(uuid)
            if node is None:
                return NotFound(f"no node with id {uuid}")
            try:
                result = change(node)
            except Exception as exc:
                return exc
            others = []
            if isinstance(result, Also):
                others, result = list(result.others), result.answer
            changed = [*([node] if node.pending_events else []), *others]
            if not changed:
                return result
            try:
                self.service.store.save(*changed, actor=actor)
            except IntegrityError:
                continue
            return result
        return Conflict("the node kept changing while this change was being saved: try again")

    # ---------------------------------------------------------------- queries

    def list(self, principal: Principal, tenant_id: str | None, pool_id: str | None,
             all_tenants: bool = False, include_removed: bool = False
             ) -> builtins.list[dict[str, Any]]:
        """The nodes, oldest first, each with the newest heartbeat as ``session.lastSeen``;
        removed nodes only with ``include_removed``."""
        where = None
        if pool_id:
            parse_id("pool", pool_id)  # a malformed --pool is an error, not an empty list
            where = {"poolId": pool_id}
        if principal.is_root and tenant_id is None:
            all_tenants = True
        tenant = self.service.aggregates.listed_tenant(principal, tenant_id, all_tenants, "nodes")
        docs = self.service.listing("node", tenant_id=tenant, where=where)
        if not include_removed:
            docs = [d for d in docs if d.get("provisionState") != PROVISION_REMOVED]
        return self._last_seen(docs)

    def get(self, principal: Principal, node_id: str) -> dict[str, Any]:
        """The node, with ``report``: the newest report summary the gateway kept (or null),
        and the newest heartbeat as ``session.lastSeen``."""
        node = self._node(principal, node_id)
        doc = node.to_doc()
        doc["report"] = Reports(self.service.sql).latest(str(node.id))
        return self._last_seen([doc])[0]

    def _last_seen(self, docs: builtins.list[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
        """``session.lastSeen`` of each node: its newest heartbeat or report in its current
        session (what the gateway keeps beside the events, api/store/node_presence.py) when
        that is newer than the last session event (connected, disconnected)."""
        if not docs:
            return docs
        heard = Presence(self.service.sql).last_seen()
        for doc in docs:
            session = doc.get("session") or {}
            beat = heard.get(str(parse_id("node", doc["id"])))
            if beat is None or beat[0] != session.get("epoch"):
                continue
            recorded = session.get("lastSeen")
            if recorded is None or _moment(recorded) < beat[1]:
                doc["session"] = {**session, "lastSeen": iso(beat[1])}
        return docs

    def events(self, principal: Principal, node_id: str) -> builtins.list[dict[str, Any]]:
        """Every event of the node, oldest first, as the event log shows them."""
        node = self._node(principal, node_id)
        sql = self.service.sql
        if sql.postgres:
            table = self.service.store.recorder.events_table_name
            statement = (f"SELECT notification_id AS seq, originator_id, originator_version, "
                         f"topic, state FROM {table} WHERE originator_id = %s "
                         "ORDER BY originator_version")
            key: Any = node.id
        else:
            statement = ("SELECT rowid AS seq, originator_id, originator_version, topic, state "
                         "FROM stored_events WHERE originator_id = ? ORDER BY originator_version")
            key = node.id.hex
        with sql.transaction(commit=False) as cursor:
            cursor.execute(statement, (key,))
            rows = cursor.fetchall()
        docs = []
        for row in rows:
            state = row["state"]
            notification = Notification(
                id=int(row["seq"]), originator_id=node.id,
                originator_version=int(row["originator_version"]), topic=str(row["topic"]),
                state=bytes(state) if not isinstance(state, bytes) else state,
            )
            entry = render(notification, self.service.store.mapper.to_domain_event)
            docs.append(msgspec.json.decode(entry.line))
        return docs

    def capacity(self, principal: Principal, pool_id: str) -> dict[str, Any]:
        pool = self.service.pool(principal, pool_id)
        self.service.projections.catch_up("capacity")
        resources = capacity_resources(read_capacity(self.service.sql, pool.public_id))
        return {"poolId": pool.public_id, "gpuModel": pool.gpu_model, "resources": resources,
                "nodes": count_nodes(self.service.sql, pool.public_id),
                "quota": self._quota(pool, principal.tenant_id)}

    def _quota(self, pool: Pool, tenant_id: str) -> dict[str, Any]:
        """The tenant's quota on the pool and its use, as ``capacity.preview`` answers it."""
        limit = pool.quota_for(tenant_id)
        if limit is None:
            return {"tenantId": tenant_id, "gpu": "unlimited", "inUse": 0}
        use = self.service.aggregates.get(QuotaUse, quota_uuid(pool.public_id, tenant_id))
        return {"tenantId": tenant_id, "gpu": limit, "inUse": use.in_use if use else 0}

    def capacity_history(self, principal: Principal, pool_id: str, window: str | None
                         ) -> dict[str, Any]:
        """The pool's GPU figures over the last ``window`` (docs/capacity.md#history)."""
        pool = self.service.pool(principal, pool_id)
        span = parse_duration(window or "24h", flag="window")
        if not HISTORY_MIN <= span <= HISTORY_MAX:
            raise InvalidInput(f"window {window} is out of range: the history covers "
                               f"{format_duration(HISTORY_MIN)} to {format_duration(HISTORY_MAX)} "
                               "(for example 24h or 7d)")
        self.service.projections.catch_up("capacity")
        now = self.service.aggregates.now()
        history = read_history(self.service.sql, pool.public_id, now, int(span.total_seconds()))
        return {"poolId": pool.public_id, "window": format_duration(span),
                "step": format_duration(timedelta(seconds=history["step"])),
                "from": iso(now - span), "to": iso(now), "points": history["points"]}

    # --------------------------------------------------------------- commands

    def adopt(self, principal: Principal, tenant_id: str | None, node_id: str,
              reason: str | None) -> dict[str, Any]:
        """Start a new acceptance attempt (after a failed one, once its cause is fixed)."""
        node = self._node(principal, node_id)
        if tenant_id is not None and tenant_id != node.tenant_id:
            raise NotFound(f"no node {node_id!r} in tenant {tenant_id}")
        principal.require_admin_of(node.tenant_id, "adopt nodes")
        why = _reason(reason, "adopt") or "nodes.adopt"
        checks = self.checks_for(node)
        node, _ = self._change(node.id, lambda n: n.start_acceptance(
            self.clock(), checks, why, principal.token_id or "local operator"),
            actor=principal.actor)
        return node.to_doc()

    def checks_for(self, node: Node) -> builtins.list[dict[str, Any]]:
        pool = self._pool(node.pool_id)
        return acceptance_checks(pool.policy, pool.gpu_model)

    def cordon(self, principal: Principal, node_id: str, reason: str | None) -> dict[str, Any]:
        node = self._node(principal, node_id)
        principal.require_admin_of(node.tenant_id, "cordon nodes")
        why = _reason(reason, "cordon") or "maintenance"
        node, _ = self._change(node.id, lambda n: n.cordon(why, self.clock(), principal.token_id),
                               actor=principal.actor)
        return node.to_doc()

    def uncordon(self, principal: Principal, node_id: str) -> dict[str, Any]:
        node = self._node(principal, node_id)
        principal.require_admin_of(node.tenant_id, "uncordon nodes")
        node, _ = self._change(node.id, lambda n: n.uncordon(self.clock(), principal.token_id),
                               actor=principal.actor)
        return node.to_doc()

    # ---------------------------------------------------- drain and remove

    def _bookings(self, node: Node) -> NodeBookings | None:
        return self.service.aggregates.get(NodeBookings, bookings_uuid(node.public_id))

    def _held(self, node: Node) -> set[str]:
        """Allocation ids held (device assignments) or booked (now or later) on ``node``."""
        bookings = self._bookings(node)
        return {*(bookings.bookings if bookings else {}),
                *(str(a["allocationId"]) for a in node.device_assignments())}

    def drain(self, principal: Principal, node_id: str, reason: str | None) -> dict[str, Any]:
        """No new placements; what is held or booked stays until it ends (docs/nodes.md)."""
        node = self._node(principal, node_id)
        principal.require_admin_of(node.tenant_id, "drain nodes")
        why = _reason(reason, "drain") or "drain"

        def change(n: Node) -> bool:
            return n.drain(why, self.clock(), principal.token_id, len(self._held(n)))

        node, _ = self._change(node.id, change, actor=principal.actor)
        return node.to_doc()

    def remove(self, principal: Principal, node_id: str, reason: str | None, force: bool
               ) -> dict[str, Any]:
        """Out of its pool. Refused while anything is held or booked, unless ``force``:
        then every reservation on it is released (reason ``node-removed``) in the same
        atomic save, before ``node.removed``."""
        first = self._node(principal, node_id)
        principal.require_admin_of(first.tenant_id, "remove nodes")
        why = _reason(reason, "remove") or "removed"
        for _ in range(RETRY_ATTEMPTS):
            node = self.load(first.id)
            assert node is not None
            if node.removed:
                raise Conflict(f"node {node.public_id} is already removed: the machine joins "
                               "again with bcd join")
            bookings = self._bookings(node)
            held = sorted({str(b["reservationId"]) for b in (bookings.bookings if bookings
                                                              else {}).values()}
                          | {str(a.get("reservationId")) for a in node.device_assignments()})
            if held and not force:
                raise Conflict(
                    f"node {node.public_id} still holds or has booked {len(held)} "
                    f"reservation{'s' if len(held) != 1 else ''} ({', '.join(held[:5])}"
                    f"{', …' if len(held) > 5 else ''}): drain it and wait until "
                    f"`better-compute nodes get {node.public_id} --query maintenance.state` says "
                    "drained, or remove it now with --force (releases them)")
            now = self.clock()
            released, changed = self._release_all(node, bookings, now) if held else ([], [])
            # Its GPUs are nobody's any more (another node may take a card moved to it).
            changed += release_all(self.service.aggregates, node,
                                   [g.uuid for g in node.gpu_values()], now, "removed")
            node.remove(now, principal.token_id, why, released)
            try:
                self.service.store.save(*changed, node, actor=principal.actor)
            except IntegrityError:
                continue  # a booking or the node changed meanwhile: look again
            return node.to_doc()
        raise Conflict("the node kept changing while it was being removed: try again")

    def _release_all(self, node: Node, bookings: NodeBookings | None, now: datetime
                     ) -> tuple[builtins.list[str], builtins.list[TenantOwned]]:
        """Release every live reservation booked on ``node`` and end its bookings."""
        released: builtins.list[str] = []
        changed: builtins.list[TenantOwned] = []
        quotas: dict[UUID, QuotaUse] = {}
        for allocation_id, booking in list((bookings.bookings if bookings else {}).items()):
            rsv = self.service.aggregates.get(Reservation, parse_id("rsv", str(booking["reservationId"])))
            if rsv is not None and rsv.allocation_id == allocation_id and \
                    rsv.release(now, reason="node-removed"):
                released.append(rsv.public_id)
                changed.append(rsv)
                key = quota_uuid(rsv.pool_id, rsv.tenant_id)
                quota = quotas.get(key) or self.service.aggregates.get(QuotaUse, key)
                if quota is not None and quota.refund(rsv.public_id):
                    quotas[key] = quota
            assert bookings is not None
            bookings.end(allocation_id, now)
            node.unassign_devices(allocation_id, now)
        for assignment in node.device_assignments():  # a hold with no booking left
            node.unassign_devices(str(assignment["allocationId"]), now)
        if bookings is not None and bookings.pending_events:
            changed.append(bookings)
        return released, [*changed, *quotas.values()]

    # ------------------------------------------------- gateway and controller

    # Each command below is one change of one node (``_change``); the changes themselves are
    # public (``opening``, ``closing``, ...) so that the gateway and the controller can give
    # many of them to ``change_each`` at once.

    def session_opened(self, uuid: UUID, bcd_version: str | None, *, actor: str
                       ) -> tuple[int, Node]:
        node, epoch = self._change(uuid, self.opening(bcd_version), actor=actor)
        return epoch, node

    def opening(self, bcd_version: str | None) -> Callable[[Node], int]:
        """A new gateway session: the change returns its epoch."""
        return lambda n: n.connect(self.clock(), bcd_version)

    def session_closed(self, uuid: UUID, epoch: int, reason: str, *, actor: str) -> bool:
        return bool(self._change(uuid, self.closing(epoch, reason), actor=actor)[1])

    def closing(self, epoch: int, reason: str) -> Callable[[Node], bool]:
        """The session of ``epoch`` ended: True when that was the node's session."""
        return lambda n: n.disconnect(epoch, self.clock(), reason)

    def mark_unreachable(self, uuid: UUID, epoch: int, last_seen: datetime | None, *,
                         actor: str) -> bool:
        return bool(self._change(uuid, self.unreachable(epoch, last_seen), actor=actor)[1])

    def unreachable(self, epoch: int, last_seen: datetime | None) -> Callable[[Node], bool]:
        """Nothing heard from session ``epoch`` since ``last_seen``: True when marked."""
        def change(node: Node) -> bool:
            if node.session_epoch != epoch:  # it reconnected since the controller looked
                return False
            return node.mark_unreachable(self.clock(), last_seen)

        return change

    def start_first_acceptance(self, uuid: UUID, *, actor: str) -> int | None:
        """The controller's step: a connected node that never ran acceptance starts attempt 1."""
        result = self.start_first_acceptances([uuid], actor=actor)[0]
        if isinstance(result, Exception):
            raise result
        return cast(int | None, result)

    def start_first_acceptances(self, uuids: Sequence[UUID], *, actor: str
                                ) -> builtins.list[Any]:
        """``start_first_acceptance`` for each node, in one write (``change_each``): the
        attempt started, None where none was due, or the error."""
        checks: dict[str, builtins.list[dict[str, Any]]] = {}  # by pool, read once each

        def change(n: Node) -> int | None:
            if n.adopted or n.acceptance_state != ACCEPTANCE_PENDING or n.session != "connected":
                return None
            if n.pool_id not in checks:
                checks[n.pool_id] = self.checks_for(n)
            return n.start_acceptance(self.clock(), checks[n.pool_id],
                                      "the node's session is up", None)

        return self.change_each([(uuid, change, actor) for uuid in uuids])

    def time_out_acceptance(self, uuid: UUID, attempt: int, after: timedelta, *, actor: str
                            ) -> bool:
        """The controller's step: ``attempt`` ran for ``after`` without a verdict: failed."""
        return self._change(uuid, lambda n: n.time_out_acceptance(attempt, self.clock(),
                                                                  after), actor=actor)[1]

    def certificate_renewed(self, uuid: UUID, epoch: int, serial: str,
                            not_after: datetime, *, actor: str) -> None:
        """Record a certificate the gateway issued over session ``epoch`` (api/gateway/renewal.py)."""
        def change(node: Node) -> None:
            if node.session_epoch != epoch:
                raise Conflict(f"session epoch {epoch} of node {node.public_id} is stale "
                               f"(current {node.session_epoch})")
            node.renew_certificate(serial, not_after, self.clock())

        self._change(uuid, change, actor=actor)

    def gpu_health(self, uuid: UUID, epoch: int, gpus: builtins.list[Gpu], *, actor: str
                   ) -> int:
        """Health from a report's inventory: one event per GPU whose health changed."""
        def change(node: Node) -> int:
            if node.session_epoch != epoch:
                return 0
            now = self.clock()
            return sum(1 for gpu in gpus if node.set_gpu_health(
                gpu.uuid, gpu.healthy, list(gpu.health_reasons), now))

        return self._change(uuid, change, actor=actor)[1]

