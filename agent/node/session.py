"""The node session with the gateway (api/wire/gateway.py), kept up for as long as bcd runs.

:func:`session_loop` connects over mutual TLS, says Hello, waits for Welcome, then runs
the session until it ends (the gateway closes it, fences it off with a newer one, or the
network drops), waits a backoff with jitter, and connects again, forever. Each session:

* prints ``bcd node: session connected (epoch N)`` (tests and operators wait for it);
* sends a Report at once, a Heartbeat every ``heartbeat_seconds`` (a Report with
  telemetry every ``report_every`` heartbeats, and at once when the GPUs' health changes
  or a desired state was applied), and every journal entry not yet settled, in order;
* applies each DesiredState of its epoch (messages of another epoch are stale: ignored);
* settles journal entries on Ack, and on Nack unless the code says to retry (then sends
  the entry again a heartbeat interval later: the control plane's store was away);
* stops (``NodeRemoved``) when the gateway says the node was removed: bcd node then
  exits with status 3, which its systemd unit does not restart;
* renews the node certificate for the same key when less than a third of its lifetime is
  left (agent/node/renewal.py): a Renew at the session's start and on each check, the
  Renewed certificate written for the next connection, a ``renew_*`` refusal logged and
  retried later without ending the session.

A dead peer that sends nothing is noticed by TCP_USER_TIMEOUT and keepalives on the
socket (a few heartbeat intervals), so a network drop ends the session without a reply.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from anyio.abc import ByteStream, SocketAttribute
from anyio.streams.buffered import BufferedByteReceiveStream

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
    decode_to_node,
    encode,
)
from better_compute.api.wire.inventory import Telemetry

from ..errors import BcdError
from ..version import bcd_version

if TYPE_CHECKING:
    from .agent import NodeAgent

MAX_LINE = 16 * 1024 * 1024
# Nack codes after which the entry is sent again in the next session instead of settled.
RETRY_CODES = frozenset({"stale_epoch", "stale-epoch", "unavailable", "retry"})


class SessionEnded(Exception):
    """The session is over for a reason worth a log line (refused, closed, timed out)."""


class NodeRemoved(Exception):
    """The control plane removed this node: bcd stops instead of reconnecting."""


REMOVED_CODES = frozenset({"node_removed"})


CONNECTION_ERRORS = (OSError, ssl.SSLError, TimeoutError, SessionEnded, anyio.EndOfStream,
                     anyio.BrokenResourceError, anyio.ClosedResourceError,
                     anyio.IncompleteRead, anyio.DelimiterNotFound)


class Link:
    """One connected session: its epoch and a send that several tasks share."""

    def __init__(self, stream: ByteStream, epoch: int) -> None:
        self.stream = stream
        self.epoch = epoch
        self._lock = anyio.Lock()
        self.sent: set[int] = set()  # journal entries sent in this session
        self.nacked: set[int] = set()  # of those, nacked with a code that says to try again

    async def send(self, message: Msg) -> None:
        async with self._lock:
            await self.stream.send(encode(message))


def _tune_socket(stream: ByteStream, heartbeat: float) -> None:
    """Notice a silent dead peer within a few heartbeats (Linux options; best effort)."""
    raw = stream.extra(SocketAttribute.raw_socket, None)
    if raw is None:
        return
    grace = max(10.0, heartbeat * 3)
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_USER_TIMEOUT", int(grace * 1000)), ("TCP_KEEPIDLE", int(grace)),
                        ("TCP_KEEPINTVL", max(1, int(heartbeat))), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        with suppress(OSError):
            raw.setsockopt(level, option, value)


async def _receive(reader: BufferedByteReceiveStream) -> Any:
    """The next message bcd understands; unknown types and malformed lines are skipped."""
    while True:
        line = await reader.receive_until(b"\n", MAX_LINE)
        if not line.strip():
            continue
        try:
            return decode_to_node(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # a newer gateway's message: the protocol says skip it


def report(agent: NodeAgent, link: Link) -> Report:
    inventory = agent.inventory
    return Report(
        epoch=link.epoch, applied_generation=agent.state.applied_generation,
        observed_generation=agent.state.observed_generation,
        sections=dict(agent.state.sections), inventory=inventory,
        telemetry=None if inventory is None else Telemetry.of(inventory, agent.inventory_time),
    )


async def _heartbeats(agent: NodeAgent, link: Link) -> None:
    beats = 0
    while True:
        await anyio.sleep(agent.heartbeat_seconds)
        await link.send(Heartbeat(epoch=link.epoch, time=agent.now()))
        beats += 1
        if beats % max(1, agent.options.report_every) == 0:
            agent.report_wanted.fire()


async def _reports(agent: NodeAgent, link: Link) -> None:
    while True:
        wake = agent.report_wanted.waiter()
        await link.send(report(agent, link))
        await wake.wait()


async def _journal(agent: NodeAgent, link: Link) -> None:
    """Send every unsettled entry once per session; one nacked with a retry code (the
    control plane's store away) again a heartbeat interval later, in the same session."""
    while True:
        wake = agent.journal_added.waiter()
        if link.nacked:
            await anyio.sleep(agent.heartbeat_seconds)
            link.sent -= link.nacked
            link.nacked.clear()
        for entry in agent.journal.unsettled():
            if entry.seq not in link.sent:
                await link.send(Journal(epoch=link.epoch, seq=entry.seq, entry=entry.signed))
                link.sent.add(entry.seq)
        await wake.wait()


async def _read(agent: NodeAgent, link: Link, reader: BufferedByteReceiveStream) -> None:
    while True:
        message = await _receive(reader)
        if isinstance(message, DesiredState):
            if message.epoch == link.epoch:
                agent.on_desired(message.generation, dict(message.sections))
        elif isinstance(message, Ack):
            agent.settle(message.seq, "acked")
        elif isinstance(message, Nack):
            agent.say(f"journal entry {message.seq} refused: {message.code}: {message.message}")
            if message.code not in RETRY_CODES:
                agent.settle(message.seq, f"nacked:{message.code}")
            elif message.code in ("unavailable", "retry"):
                link.nacked.add(message.seq)
                agent.journal_added.fire()
        elif isinstance(message, Renewed):
            await anyio.to_thread.run_sync(agent.on_renewed, message.certificate_pem,
                                           message.not_after)
            agent.renewal_answered()
        elif isinstance(message, Refused) and message.code.startswith("renew_"):
            agent.on_renew_refused(message.code, message.message)  # the session stays up
            agent.renewal_answered()
        elif isinstance(message, Refused) and message.code in REMOVED_CODES:
            raise NodeRemoved(message.message)
        elif isinstance(message, Refused):
            raise SessionEnded(f"the gateway ended the session: {message.code}: "
                               f"{message.message}")


async def _renewals(agent: NodeAgent, link: Link) -> None:
    """Renew the certificate when it is due: at the session's start, then every check."""
    options = agent.options
    while True:
        if agent.renewal_due():
            answer = agent.renewal.answer = anyio.Event()
            await link.send(Renew(epoch=link.epoch, csr_pem=agent.renewal_csr()))
            with anyio.move_on_after(options.renew_answer_timeout):
                await answer.wait()
            agent.renewal.answer = None
            if agent.renewal_due():  # refused, failed or unanswered: not before the retry
                await anyio.sleep(options.renew_retry_seconds)
                continue
        await anyio.sleep(options.renew_check_seconds)


@contextmanager
def _connected(agent: NodeAgent, link: Link) -> Iterator[None]:
    info = agent.session
    info.state, info.epoch, info.since, info.last_error = "connected", link.epoch, agent.now(), None
    info.connects += 1
    agent.state.last_epoch = max(agent.state.last_epoch, link.epoch)
    try:
        yield
    finally:
        info.state = "disconnected"


async def run_session(agent: NodeAgent, stream: ByteStream) -> None:
    """One session on a connected stream; returns never, raises how it ended."""
    reader = BufferedByteReceiveStream(stream)
    identity = agent.settings.identity
    await stream.send(encode(Hello(
        node_id=identity.node_id, bcd_version=bcd_version(),
        applied_generation=agent.state.applied_generation,
        observed_generation=agent.state.observed_generation)))
    with anyio.fail_after(agent.options.welcome_timeout):
        first = await _receive(reader)
    if isinstance(first, Refused) and first.code in REMOVED_CODES:
        raise NodeRemoved(first.message)
    if isinstance(first, Refused):
        raise SessionEnded(f"the gateway refused the session: {first.code}: {first.message}")
    if not isinstance(first, Welcome):
        raise SessionEnded(f"the gateway answered Hello with {type(first).__name__}, "
                           "not Welcome")
    link = Link(stream, first.epoch)
    if first.heartbeat_seconds > 0:
        agent.heartbeat_seconds = first.heartbeat_seconds
    _tune_socket(stream, agent.heartbeat_seconds)
    agent.options.backoff.reset()
    with _connected(agent, link):
        agent.say(f"session connected (epoch {link.epoch})")
        async with anyio.create_task_group() as group:
            group.start_soon(_reports, agent, link)
            group.start_soon(_journal, agent, link)
            group.start_soon(_heartbeats, agent, link)
            group.start_soon(_renewals, agent, link)
            try:
                await _read(agent, link, reader)
            except anyio.EndOfStream:
                raise SessionEnded("the gateway closed the session") from None


def _describe(group: BaseExceptionGroup[Exception]) -> str:
    def leaves(error: BaseException) -> Iterator[BaseException]:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                yield from leaves(inner)
        else:
            yield error

    first = next(leaves(group))
    text = str(first) or type(first).__name__
    if isinstance(first, anyio.EndOfStream | anyio.IncompleteRead | anyio.BrokenResourceError):
        text = "the gateway closed the session"
    return text


async def _connect(host: str, port: int, context: ssl.SSLContext, timeout: float
                   ) -> ByteStream:
    """The TLS connection to the gateway, within ``timeout``: a gateway that accepts and never
    finishes the handshake (a stuck process, a load balancer that black-holes) ends the
    attempt with a reason, and the loop connects again, instead of waiting forever."""
    try:
        with anyio.fail_after(timeout):
            return await anyio.connect_tcp(host, port, ssl_context=context,
                                           tls_standard_compatible=False)
    except TimeoutError:
        raise SessionEnded(f"the gateway accepted the connection and did not complete the "
                           f"TLS handshake within {timeout:g}s") from None


async def session_loop(agent: NodeAgent) -> None:
    gateway = agent.settings.gateway
    context = agent.settings.ssl_context()
    while True:
        reason = "the session ended"
        if agent.tls_changed:  # a renewed node.crt: present it from this connection on
            agent.tls_changed = False
            try:
                context = agent.settings.ssl_context()
            except BcdError as exc:
                agent.say(f"cannot use the renewed certificate ({exc}); keeping the old one")
        try:
            stream = await _connect(gateway.host, gateway.port, context,
                                    agent.options.welcome_timeout)
            async with stream:
                await run_session(agent, stream)
        except* NodeRemoved as group:
            agent.on_removed(_describe(group))
        except* CONNECTION_ERRORS as group:
            reason = _describe(group)
        if agent.removed is not None:
            return  # bcd stops: reconnecting would be refused again
        agent.session.last_error = reason  # the state stays connecting until a first Welcome
        delay = agent.options.backoff.next_delay()
        agent.say(f"session lost: {reason}; reconnecting in {delay:.1f}s")
        await anyio.sleep(delay)
