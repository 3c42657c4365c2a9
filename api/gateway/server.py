"""The gateway listener: admit a node, run its session, fence the older one.

Admission, after the TLS handshake verified the client certificate against
the node CA: the first line must be a Hello whose ``nodeId`` equals the
certificate's common name; the node must exist and the certificate's key
must be the key whose pin the node recorded at join. Anything else is
answered with Refused and the connection closes, recording nothing.

Wake-ups: one task follows the process's event hub (the /watch follower)
and pokes the session of every node an event is about, so a changed desired
state goes down at once, whichever replica recorded it. Heartbeats are kept
in memory and written to ``bc_node_presence`` once per ``flush_interval``.

Store outages: the gateway keeps listening and its sessions stay up. A flush
that fails keeps its heartbeats for the next one; a session's store call that
fails answers ``unavailable`` (a journal entry is nacked with that code, so
bcd sends it again); a node that connects meanwhile is refused with that code
and reconnects with backoff. Nothing a session raises ends the listener.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar
from uuid import UUID

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream, BufferedByteStream
from anyio.streams.tls import TLSAttribute, TLSListener, TLSStream
from cryptography import x509

from better_compute.api import pki
from better_compute.api.gateway.journal import journal_handlers, node_changes
from better_compute.api.gateway.renewal import Renewal
from better_compute.api.gateway.session import (
    _CLOSED,
    MAX_LINE,
    NODE_REMOVED,
    REPLICA_STOPPING,
    STOPPING_MESSAGE,
    Session,
    removed_message,
)
from better_compute.api.gateway.writes import NodeWrites
from better_compute.api.net import Handshakes, peer_host
from better_compute.api.services.compute import ComputeService
from better_compute.api.services.join import NODE_CERTIFICATE_LIFETIME
from better_compute.api.services.registry import Services
from better_compute.api.settings import env_count
from better_compute.api.store.eventlog import EventFilter
from better_compute.api.store.node_presence import Presence, Reports
from better_compute.api.store.outage import outage_error, unavailable_on_outage
from better_compute.api.supervise import Retry
from better_compute.api.wire.gateway import Hello, Refused, decode_to_gateway, encode
from better_compute.domain.errors import BetterComputeError, InvalidInput, NotFound, Unavailable
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node

log = logging.getLogger("better_compute.gateway")
HANDSHAKE_REFUSED = "gateway: TLS handshake refused: %s"  # one a minute (http_limits.ClientNoise)
T = TypeVar("T")


class Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _open_bundle(service: ComputeService) -> pki.PkiBundle:
    if service.master_key_text is None:
        raise Unavailable("no master key: run serve with BETTER_COMPUTE_MASTER_KEY_FILE set")
    return pki.unseal_bundle(service.pki().sealed, pki.parse_master_key(service.master_key_text()))


_CHANGED = -1  # ``Gateway._missed``: an event other than a session's opening

# Connections the kernel holds for the gateway before it accepts them. Anything queued there
# waits unseen: with the system's default (4,096 here) a fleet connecting at once to a busy
# server waited longer than bcd's 15 s connect timeout, so the gateway spent its handshakes on
# connections their node had given up on and almost none succeeded. A short queue turns the
# excess away before it costs anything; bcd tries again with its backoff
# (docs/performance.md, "A fleet on one server").
LISTEN_BACKLOG = 64
MAX_HANDSHAKES_PER_ADDRESS = 256  # nodes behind one NAT reconnect at once after a restart
MAX_HANDSHAKES = 1024


def gateway_handshakes(env: Mapping[str, str] | None) -> Handshakes:
    """The gateway's bounds of handshakes under way, as the server's settings give them."""
    return Handshakes(
        env_count(env, "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES", MAX_HANDSHAKES),
        env_count(env, "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES_PER_ADDRESS",
                  MAX_HANDSHAKES_PER_ADDRESS),
        settings=("gateway.max_handshakes", "gateway.max_handshakes_per_address"))


class _BoundedTLSListener(TLSListener):
    """Handshakes under way bounded as the API's listener bounds them (api/net.py
    ``Handshakes``: past an address's bound a connection is closed before its handshake;
    past the bound in all the oldest under way is dropped for it). A failed handshake (no or
    wrong client certificate, or none in time) is one warning line, no traceback; serve's
    log keeps such lines to one a minute (ClientNoise)."""

    def __init__(self, listener: Any, ssl_context: ssl.SSLContext, handshakes: Handshakes,
                 handshake_timeout: float) -> None:
        super().__init__(listener, ssl_context, standard_compatible=False,
                         handshake_timeout=handshake_timeout)
        self.handshakes = handshakes

    async def serve(self, handler: Callable[[TLSStream], Any],
                    task_group: anyio.abc.TaskGroup | None = None) -> None:
        async def handshake(stream: Any) -> None:
            wrapped = None
            with anyio.CancelScope() as dropped:
                ticket = self.handshakes.begin(_host(stream), dropped.cancel)
                if ticket is None:
                    await anyio.aclose_forcefully(stream)
                    return
                try:
                    with anyio.fail_after(self.handshake_timeout):
                        # Nothing of TLS before the client's first byte (its ClientHello):
                        # a connection that says nothing holds a socket, not a TLS session.
                        buffered = BufferedByteStream(stream)
                        buffered.feed_data(await stream.receive())
                        wrapped = await TLSStream.wrap(buffered, ssl_context=self.ssl_context,
                                                       standard_compatible=False)
                except BaseException as exc:
                    await self.handle_handshake_error(exc, stream)
                finally:
                    self.handshakes.end(ticket)
            if wrapped is not None:
                await handler(wrapped)

        await self.listener.serve(handshake, task_group)

    @staticmethod
    async def handle_handshake_error(exc: BaseException, stream: Any) -> None:
        await anyio.aclose_forcefully(stream)
        if isinstance(exc, anyio.get_cancelled_exc_class()) or not isinstance(exc, Exception):
            raise exc
        reason = "not done within the hello timeout" if isinstance(exc, TimeoutError) else exc
        log.warning(HANDSHAKE_REFUSED, reason)


def _host(stream: Any) -> str | None:
    """The client's address (without its port)."""
    try:
        return peer_host(stream.extra(anyio.abc.SocketAttribute.remote_address))
    except anyio.TypedAttributeLookupError:
        return None


class Gateway:
    def __init__(self, services: Services, ssl_context: ssl.SSLContext, *,
                 heartbeat_seconds: float = 5.0, flush_interval: float = 1.0,
                 hello_timeout: float = 10.0, min_idle: float = 15.0,
                 hub: Any = None, limiter: anyio.CapacityLimiter | None = None,
                 bundle: pki.PkiBundle | None = None,
                 certificate_lifetime: timedelta = NODE_CERTIFICATE_LIFETIME,
                 handshakes: Handshakes | None = None) -> None:
        service = services.compute
        self.nodes = services.nodes
        self.inventory = services.inventory
        self.journal_handlers = journal_handlers(services)
        self.node_changes = node_changes(services)
        self.renewal = Renewal(self.nodes, (lambda: bundle) if bundle is not None
                               else lambda: _open_bundle(service), certificate_lifetime)
        self.presence = Presence(service.sql)
        self.report_rows = Reports(service.sql)
        self.ssl_context = ssl_context
        self.heartbeat_seconds = heartbeat_seconds
        self.flush_interval = flush_interval
        self.hello_timeout = hello_timeout
        self.handshakes = handshakes or gateway_handshakes(None)
        self.min_idle = min_idle
        self.hub = hub
        self.limiter = limiter or anyio.CapacityLimiter(4)
        # The node writes and the heartbeat flush each have a thread of their own: queued
        # behind the sessions' reads of their nodes (a fleet's adoption wakes every session),
        # a flush can come later than ``unreachable_after`` and the controller would take a
        # fleet that heartbeats for silent (docs/decisions.md, "A fleet on one server").
        self.writes = NodeWrites(self.nodes, partial(self.call, limiter=anyio.CapacityLimiter(1)))
        self._flushing = anyio.CapacityLimiter(1)
        self._pool_sections: dict[str, dict[str, Any]] = {}
        # Nodes with no session here that an event was about: the epoch of a node.connected
        # (a session opening), or _CHANGED for anything else (``_poke_for``).
        self._missed: dict[str, int] = {}
        self.sessions: dict[str, Session] = {}
        self.beats: dict[str, tuple[int, datetime]] = {}
        self.reports: dict[str, tuple[int, datetime, dict[str, Any]]] = {}
        self.stats: Counter[str] = Counter()
        self.port = 0
        self.listening = False
        self.stopping = False  # hand_back: new sessions are refused

    async def call(self, fn: Callable[..., T], *args: Any,
                   limiter: anyio.CapacityLimiter | None = None) -> T:
        """``fn`` in a worker thread (one of ``limiter``'s, by default the sessions'); a
        store outage comes back as ``Unavailable``."""
        with unavailable_on_outage():
            return await anyio.to_thread.run_sync(fn, *args, limiter=limiter or self.limiter)

    # -------------------------------------------------------------- running

    async def serve(self, host: str, port: int, *,
                    task_status: anyio.abc.TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status`` gets the bound port."""
        tcp = await anyio.create_tcp_listener(local_host=host, local_port=port,
                                              backlog=LISTEN_BACKLOG)
        self.port = int(tcp.extra(anyio.abc.SocketAttribute.local_port))
        # A handshake has the hello's time too (anyio's default is 30 s): the port faces
        # every network the nodes are on, and a connection that never finishes its
        # handshake holds a descriptor until then.
        listener = _BoundedTLSListener(tcp, self.ssl_context, self.handshakes,
                                       handshake_timeout=self.hello_timeout)
        # The node writes outlive the sessions: each session's end is written as it closes,
        # also when the server stops (the writer is stopped once every session has ended).
        writer = anyio.CancelScope(shield=True)
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(self._write_nodes, writer)
                try:
                    async with listener, anyio.create_task_group() as tg:
                        tg.start_soon(self._flush_loop)
                        if self.hub is not None:
                            tg.start_soon(self._follow_events)
                        self.listening = True
                        task_status.started(self.port)
                        await listener.serve(self._connection, task_group=tg)
                finally:
                    writer.cancel()
        finally:
            self.listening = False

    async def _write_nodes(self, scope: anyio.CancelScope) -> None:
        with scope:
            await self.writes.run()

    async def _flush_loop(self) -> None:
        retry = Retry("writing the nodes' heartbeats", log)
        while True:
            await anyio.sleep(self.flush_interval)
            try:
                await self.flush_heartbeats()
            except Exception as exc:  # kept for the next flush (a store outage, say)
                retry.failed(exc)
            else:
                retry.succeeded()

    async def flush_heartbeats(self) -> int:
        """Write the newest heartbeat and report summary of each node heard since last time.

        When the write fails they are kept (newer ones heard meanwhile win) and the
        error is raised: the next flush writes them.
        """
        beats, self.beats = self.beats, {}
        reports, self.reports = self.reports, {}
        written = 0
        try:
            if beats:
                rows = [(uuid, epoch, at) for uuid, (epoch, at) in beats.items()]
                written += await self.call(self.presence.record, rows,
                                           limiter=self._flushing)
            if reports:
                docs = [(uuid, epoch, at, doc) for uuid, (epoch, at, doc) in reports.items()]
                await self.call(self.report_rows.record, docs, limiter=self._flushing)
        except BaseException:
            self.beats = {**beats, **self.beats}
            self.reports = {**reports, **self.reports}
            raise
        return written

    def keep_report(self, session: Session, summary: dict[str, Any]) -> None:
        self.reports[str(session.uuid)] = (session.epoch, self.nodes.clock(), summary)

    def beat(self, session: Session, message: Any) -> None:
        self.stats["heartbeats"] += 1
        self.beats[str(session.uuid)] = (session.epoch, self.nodes.clock())

    async def _follow_events(self) -> None:
        hub = self.hub
        everything = EventFilter()
        position = hub.head
        while not hub.stopping:
            await hub.wait_beyond(position, 5.0)
            got = hub.after(position, everything)
            if got is None:  # fell behind the window: wake every session once
                position = hub.head
                self.poke_all()
                continue
            lines, position = got
            for line in lines:
                self._poke_for(line)

    def _poke_for(self, line: bytes) -> None:
        """Wake the session of each node ``line``'s event is about. A session's own
        ``node.connected`` changes nothing it sends: no wake-up (and no read of its node).
        An event for a node with no session here is kept in mind (``_missed``): a session
        that is being opened (saved, not yet in ``sessions``) reads its node once more."""
        try:
            doc = json.loads(line)
        except ValueError:
            return
        targets = {doc.get("subject")}
        data = doc.get("data") or {}
        if isinstance(data, dict):
            targets.add(data.get("nodeId"))
        opened = data.get("epoch") if doc.get("type") == "node.connected" \
            and isinstance(data, dict) else None
        for target in targets:
            if not isinstance(target, str):
                continue
            session = self.sessions.get(target)
            if session is None:
                seen = self._missed.get(target)
                self._missed[target] = opened if seen is None and isinstance(opened, int) \
                    else _CHANGED
            elif opened is None or opened != session.epoch:
                session.poke.set()

    async def hand_back(self) -> None:
        """The server is stopping: end every session, recording nothing, so that each agent
        reconnects through the load balancer to another replica (``Session.hand_back``), and
        refuse new ones (``unavailable``: bcd retries with backoff)."""
        self.stopping = True
        sessions = list(self.sessions.values())
        if sessions:
            log.warning("gateway: handing %d agent session(s) back (this replica is stopping)",
                        len(sessions))
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(session.hand_back)

    def _register(self, session: Session) -> None:
        """``session`` in the table: it fences an older one of its node, and reads its node
        again if an event came for it meanwhile (other than its own opening)."""
        older = self.sessions.get(session.node_id)
        self.sessions[session.node_id] = session
        if older is not None:
            older.fence()
        missed = self._missed.pop(session.node_id, None)
        if missed is not None and missed != session.epoch:
            session.poke.set()

    def poke_all(self) -> None:
        for session in list(self.sessions.values()):
            session.poke.set()

    # ----------------------------------------------------------- admission

    @staticmethod
    def _identify(cert: x509.Certificate, hello: Hello) -> UUID:
        """The node the certificate and the Hello both name."""
        try:
            cn = pki.node_id_from_certificate(cert)
        except InvalidInput as exc:
            raise Refusal("bad_certificate", exc.message) from None
        if cn != hello.node_id:
            raise Refusal("wrong_node", f"this certificate is node {cn}'s, not {hello.node_id}'s")
        try:
            return parse_id("node", cn)
        except BetterComputeError:
            raise Refusal("unknown_node", f"{cn!r} is not a node id") from None

    def _opening(self, pin: str, bcd_version: str | None) -> Callable[[Node], tuple[int, Node]]:
        """The change that admits a node whose certificate's key has ``pin`` and opens its
        session: (the epoch, the node)."""
        opening = self.nodes.opening(bcd_version)

        def change(node: Node) -> tuple[int, Node]:
            if node.removed:  # every certificate of a removed node is revoked
                raise Refusal(NODE_REMOVED, removed_message(node))
            if pin != node.key_pin:
                raise Refusal("wrong_key", f"the certificate's key is not the key node "
                              f"{node.public_id} joined with: use the node key and certificate "
                              "bcd join wrote")
            return opening(node), node

        return change

    async def _sections_of(self, node: Node) -> dict[str, Any]:
        """The desired-state sections of the node's pool's policy (read once per pool: a
        pool's policy never changes)."""
        sections = self._pool_sections.get(node.pool_id)
        if sections is None:
            sections = await self.call(self.nodes.pool_sections, node)
            self._pool_sections[node.pool_id] = sections
        return sections

    async def _connection(self, stream: TLSStream) -> None:
        session: Session | None = None
        try:
            der = stream.extra(TLSAttribute.peer_certificate_binary)
            if not der:
                raise Refusal("no_certificate", "the gateway needs the node certificate")
            cert = x509.load_der_x509_certificate(der)
            reader = BufferedByteReceiveStream(stream)
            with anyio.fail_after(self.hello_timeout):
                first = await reader.receive_until(b"\n", MAX_LINE)
            try:
                hello = decode_to_gateway(first)
            except msgspec.ValidationError as exc:  # a Hello past a bound (api/wire/bounds.py)
                raise Refusal("bad_hello", f"the Hello does not fit: {exc}") from None
            except msgspec.DecodeError:
                hello = None
            if not isinstance(hello, Hello):
                raise Refusal("hello_first", "the first message of a session must be a Hello")
            if self.stopping:
                raise Refusal(REPLICA_STOPPING, STOPPING_MESSAGE)
            uuid = self._identify(cert, hello)
            try:  # what this session records, the node did
                epoch, node = await self.writes.change(uuid, self._opening(
                    pki.spki_pin(cert.public_key()), hello.bcd_version), actor=hello.node_id)
            except NotFound:
                raise Refusal("unknown_node", f"no node {hello.node_id}: join again with "
                              "bcd join") from None
            session = Session(self, stream, reader, node, epoch, cert.public_key(),
                              await self._sections_of(node))
            self._register(session)
            self.stats["sessions"] += 1
            await session.run(node)
        except Refusal as refusal:
            self.stats["refused_sessions"] += 1
            log.warning("gateway: session refused (%s): %s", refusal.code, refusal.message)
            with anyio.move_on_after(2), contextlib.suppress(*_CLOSED):
                await stream.send(encode(Refused(code=refusal.code, message=refusal.message)))
        except (TimeoutError, *_CLOSED):
            pass
        except Exception as exc:  # a store outage or a bug: this session ends, not the listener
            await self._failed(stream, session, exc)
        except anyio.get_cancelled_exc_class():
            # The gateway is cancelled (a session's own end or fencing never gets here; serve
            # hands its sessions back before: hand_back): as for a hand-back, the end is not
            # the node's, and recording it would be one event per node at every stop.
            if session is not None:
                self._forget(session)
                session = None
            raise
        finally:
            if session is not None:
                await self._close(session)
            await anyio.aclose_forcefully(stream)

    async def _failed(self, stream: TLSStream, session: Session | None,
                      exc: Exception) -> None:
        error = _project_error(exc)
        if error is None:
            log.error("gateway: a session failed", exc_info=exc)
            return
        log.warning("gateway: %s: %s", f"node {session.node_id}'s session ended"
                    if session is not None else "a session was refused", error.message)
        if session is None:  # not admitted: say why, so bcd retries with backoff
            self.stats["refused_sessions"] += 1
            with anyio.move_on_after(2), contextlib.suppress(*_CLOSED):
                await stream.send(encode(Refused(code=error.code, message=error.message)))

    def _forget(self, session: Session) -> None:
        if self.sessions.get(session.node_id) is session:
            del self.sessions[session.node_id]

    async def _close(self, session: Session) -> None:
        log.info("gateway: node %s's session (epoch %d) ended: %s", session.node_id,
                 session.epoch, session.reason)
        self._forget(session)
        if session.fenced:
            return
        with anyio.CancelScope(shield=True):
            try:
                await self.writes.change(session.uuid, self.nodes.closing(session.epoch,
                                                                          session.reason),
                                         actor=session.node_id)
            except BetterComputeError as exc:
                log.warning("gateway: could not record the end of node %s's session: %s",
                            session.node_id, exc.message)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _project_error(exc: BaseException) -> BetterComputeError | None:
    """The project error (or store outage) that ended a session, if that is what it was."""
    for leaf in _leaves(exc):
        error = leaf if isinstance(leaf, BetterComputeError) else outage_error(leaf)
        if error is not None:
            return error
    return None
