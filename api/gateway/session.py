"""One node's session: Welcome, desired state down, heartbeats, reports, journal, renewals up.

The session is fenced off (closed, recording nothing more) as soon as a
newer session of the same node exists: in this process the gateway cancels
it at once; on another replica it notices on the next wake-up, when the
node's epoch has moved on. Every message that carries an epoch other than
this session's is refused. A session that hears nothing for three heartbeat
intervals (at least 15 s) closes itself: the connection is dead.
"""

from __future__ import annotations

import json
import logging
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING, Any
from uuid import UUID

import anyio
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from better_compute.api.gateway.journal import EntryRefused, verify_entry
from better_compute.api.gateway.renewal import RenewRefused
from better_compute.api.store.node_presence import summarize_report
from better_compute.api.wire import inventory as wire_inventory
from better_compute.api.wire.gateway import (
    Ack,
    DesiredState,
    Heartbeat,
    Hello,
    Journal,
    Msg,
    Nack,
    Refused,
    Renew,
    Renewed,
    Report,
    Welcome,
    decode_to_gateway,
    encode,
)
from better_compute.domain.errors import BetterComputeError, InvalidInput, Unavailable
from better_compute.domain.gpus import Gpu
from better_compute.domain.node import Node
from better_compute.domain.node_rules import SESSION_UNREACHABLE

if TYPE_CHECKING:
    from better_compute.api.gateway.server import Gateway

log = logging.getLogger("better_compute.gateway")

MAX_LINE = 1 << 20
NODE_REMOVED = "node_removed"  # Refused code: bcd stops (docs/nodes.md, "Remove")


def removed_message(node: Node) -> str:
    removal = dict(node.removal or {})
    return (f"node {node.public_id} was removed from its pool at {removal.get('at')} "
            f"({removal.get('reason') or 'removed'}); its certificate is revoked. To bring "
            "the machine back, run bcd join with a new join token: it gets the same node back")
STORE_RETRY = 1.0  # seconds before a session retries a store read that found it away
# A stopping replica's word to bcd, which connects again (any Refused but node_removed ends
# the session and bcd reconnects with backoff); the send waits HAND_BACK_SEND seconds at most.
REPLICA_STOPPING = "unavailable"
STOPPING_MESSAGE = ("this control plane replica is stopping: connect again (the load balancer "
                    "sends the session to another replica)")
HAND_BACK_SEND = 1.0
_CLOSED = (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError,
           anyio.ClosedResourceError, anyio.DelimiterNotFound, OSError)


def _health(gpus: list[Gpu]) -> dict[str, tuple[bool, tuple[str, ...]]]:
    return {g.uuid: g.health() for g in gpus}


def _reported(gpu: wire_inventory.Gpu) -> Gpu:
    """A GPU of a report's inventory as the domain reads it (its health rule, its fields)."""
    return Gpu.from_doc(msgspec.to_builtins(gpu))


class Session:
    def __init__(self, gateway: Gateway, stream: Any, reader: BufferedByteReceiveStream,
                 node: Node, epoch: int, public_key: Any,
                 pool_sections: dict[str, Any] | None = None) -> None:
        self.gateway = gateway
        self.pool_sections = pool_sections or {}  # from the pool's policy, which never changes
        self.stream = stream
        self.reader = reader
        self.node_id = node.public_id
        self.uuid: UUID = node.id
        self.epoch = epoch
        self.public_key = public_key
        self.fenced = False
        self.reason = "the connection closed"
        self.poke = anyio.Event()
        self.last_sent: tuple[int, str] | None = None
        self.health = _health(node.gpu_values())
        self.applied_generation = 0
        self.observed_generation = 0
        self.last_report: Report | None = None
        self.skipped = 0  # messages that did not decode
        self.inventory_seen: list[tuple[str, str, str | None]] | None = None
        self._send_lock = anyio.Lock()
        self._scope: anyio.CancelScope | None = None

    # ------------------------------------------------------------------ I/O

    async def send(self, message: Msg) -> None:
        async with self._send_lock:
            await self.stream.send(encode(message))

    def fence(self) -> None:
        """A newer session of this node exists: stop, record nothing more."""
        self.fenced = True
        self.reason = "fenced off by a newer session"
        if self._scope is not None:
            self._scope.cancel()

    async def hand_back(self) -> None:
        """This replica is stopping: tell bcd, and end the session recording nothing (the node
        is not gone: bcd connects again at once, through the load balancer, to another
        replica, whose session supersedes this one; were it not to, the controllers would
        mark it unreachable as for any session that went silent)."""
        self.fenced = True
        self.reason = "handed back: this replica is stopping"
        with anyio.move_on_after(HAND_BACK_SEND), suppress(*_CLOSED):
            await self.send(Refused(code=REPLICA_STOPPING, message=STOPPING_MESSAGE))
        if self._scope is not None:
            self._scope.cancel()

    async def run(self, node: Node) -> None:
        with anyio.CancelScope() as scope:
            self._scope = scope
            if self.fenced:
                return
            await self.send(Welcome(epoch=self.epoch,
                                    heartbeat_seconds=self.gateway.heartbeat_seconds))
            await self.push_desired(node)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pusher)
                try:
                    await self._receive_loop()
                finally:
                    tg.cancel_scope.cancel()

    async def push_desired(self, node: Node) -> None:
        sections = node.desired_sections(self.pool_sections)
        key = (node.generation, json.dumps(sections, sort_keys=True))
        if key == self.last_sent:
            return
        self.last_sent = key
        await self.send(DesiredState(epoch=self.epoch, generation=node.generation,
                                     sections=sections))

    async def _pusher(self) -> None:
        while True:
            await self.poke.wait()
            self.poke = anyio.Event()
            try:
                node = await self.gateway.call(self.gateway.nodes.load, self.uuid)
            except Unavailable:  # the store is away: the session stays, try again soon
                await anyio.sleep(STORE_RETRY)
                self.poke.set()
                continue
            if node is not None and node.removed:
                self.reason = "the node was removed"
                await self.send(Refused(code=NODE_REMOVED, message=removed_message(node)))
                self.fence()
                return
            if node is None or node.session_epoch != self.epoch:
                self.fence()
                return
            if node.session == SESSION_UNREACHABLE:
                # Marked unreachable while this connection lingered: close it, so bcd
                # reconnects with a new epoch and the node counts again.
                self.reason = "the node was marked unreachable"
                self.fence()
                return
            accepted = _health(node.gpu_values())
            if accepted.keys() != self.health.keys():  # an operator accepted other GPUs
                self.health = {u: self.health.get(u, h) for u, h in accepted.items()}
            await self.push_desired(node)

    async def _receive_loop(self) -> None:
        idle = max(3 * self.gateway.heartbeat_seconds, self.gateway.min_idle)
        while True:
            line: bytes | None = None
            with anyio.move_on_after(idle):
                try:
                    line = await self.reader.receive_until(b"\n", MAX_LINE)
                except _CLOSED:
                    return
            if line is None:
                self.reason = f"nothing heard for {idle:.0f}s"
                return
            if not line.strip():
                continue
            try:
                message = decode_to_gateway(line)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                # An unknown message type from a newer bcd (skipped quietly), or one past a
                # bound (api/wire/bounds.py): skipped, said once per session.
                if str(exc).endswith("`$.type`"):
                    continue
                if not self.skipped:
                    log.warning("node %s: a message that does not fit was skipped (and any "
                                "more this session): %s", self.node_id, exc)
                self.skipped += 1
                continue
            if not await self._handle(message):
                return

    # ------------------------------------------------------------- messages

    async def _stale(self, epoch: int) -> bool:
        if epoch == self.epoch:
            return False
        await self.send(Refused(code="stale_epoch", message=(
            f"epoch {epoch} is not this session's ({self.epoch}): say Hello again")))
        return True

    async def _handle(self, message: Any) -> bool:
        """Handle one message; False ends the session."""
        gateway = self.gateway
        if isinstance(message, Hello):
            return True  # already said; harmless
        if isinstance(message, Heartbeat):
            if await self._stale(message.epoch):
                return False
            gateway.beat(self, message)
            return True
        if isinstance(message, Report):
            if await self._stale(message.epoch):
                return False
            await self._report(message)
            return True
        if isinstance(message, Journal):
            await self._journal(message)
            return True
        if isinstance(message, Renew):
            if await self._stale(message.epoch):
                return False
            return await self._renew(message)
        return True

    async def _renew(self, message: Renew) -> bool:
        """Renew the node certificate for the same key; a refusal keeps the session up."""
        gateway = self.gateway
        gateway.stats["renewals"] += 1
        try:
            pem, not_after = await gateway.call(gateway.renewal.renew, self.uuid, self.epoch,
                                                message.csr_pem)
        except RenewRefused as exc:
            gateway.stats["renewals_refused"] += 1
            log.warning("node %s: certificate renewal refused (%s): %s", self.node_id, exc.code,
                        exc.message)
            await self.send(Refused(code=exc.code, message=exc.message))
            return exc.code != "stale_epoch"
        except BetterComputeError as exc:
            code = "renew_bad_csr" if isinstance(exc, InvalidInput) else "renew_unavailable"
            await self.send(Refused(code=code, message=exc.message))
            return True
        await self.send(Renewed(certificate_pem=pem, not_after=not_after))
        return True

    async def _report(self, report: Report) -> None:
        gateway = self.gateway
        gateway.beat(self, report)
        gateway.stats["reports"] += 1
        self.last_report = report
        self.applied_generation = report.applied_generation
        self.observed_generation = report.observed_generation
        gateway.keep_report(self, summarize_report(self.epoch, gateway.nodes.clock(), report))
        if report.inventory is None:
            return
        gpus = [_reported(g) for g in report.inventory.gpus]
        health = _health(gpus)
        changed = [g for g in gpus if g.uuid in self.health and health[g.uuid] != self.health[g.uuid]]
        if changed:
            try:
                await gateway.call(partial(gateway.nodes.gpu_health, actor=self.node_id),
                                   self.uuid, self.epoch, changed)
            except Unavailable:
                return  # the store is away: the next report carries the change again
            self.health.update({k: v for k, v in health.items() if k in self.health})
        await self._inventory(report.inventory.gpus)

    async def _inventory(self, gpus: list[wire_inventory.Gpu]) -> None:
        """Which GPUs the report lists: judged by the control plane when they changed since
        the last report it judged (a mismatch is recorded once; domain/node_inventory.py)."""
        seen = [(g.uuid, g.name, g.family) for g in gpus]
        if seen == self.inventory_seen:
            return
        gateway = self.gateway
        try:
            await gateway.call(gateway.inventory.reported, self.uuid, self.epoch,
                               [msgspec.to_builtins(g) for g in gpus])
        except Unavailable:
            return  # the store is away: the next report is judged again
        self.inventory_seen = seen

    async def _journal(self, message: Journal) -> None:
        gateway = self.gateway
        gateway.stats["journal"] += 1
        if message.epoch != self.epoch:
            await self.send(Nack(seq=message.seq, code="stale_epoch", message=(
                f"epoch {message.epoch} is not this session's ({self.epoch})")))
            return
        try:
            head, payload = verify_entry(self.public_key, message.entry)
            if head.node_id != self.node_id:
                raise EntryRefused("wrong_node", f"the entry names node {head.node_id}, "
                                   f"not this session's node {self.node_id}")
            change = gateway.node_changes.get(head.kind)
            handler = gateway.journal_handlers.get(head.kind)
            if change is not None:  # saved with other sessions' changes (writes.py)
                change.check(await gateway.writes.change(
                    self.uuid, change.change(self.epoch, payload), actor=self.node_id))
            elif handler is not None:
                await gateway.call(handler, self.uuid, self.epoch, payload)
            else:
                raise EntryRefused("unknown_kind", f"no handler for journal entries of kind "
                                   f"{head.kind!r} on this control plane")
        except EntryRefused as exc:
            gateway.stats["refused"] += 1
            log.warning("node %s: journal entry %d refused: %s", self.node_id, message.seq,
                        exc.message)
            await self.send(Nack(seq=message.seq, code=exc.code, message=exc.message))
            return
        except BetterComputeError as exc:
            await self.send(Nack(seq=message.seq, code=exc.code, message=exc.message))
            return
        await self.send(Ack(seq=message.seq))

    def status(self) -> dict[str, Any]:
        return {"nodeId": self.node_id, "epoch": self.epoch,
                "appliedGeneration": self.applied_generation,
                "observedGeneration": self.observed_generation}

