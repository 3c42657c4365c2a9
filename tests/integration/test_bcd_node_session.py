"""`bcd node` against an in-test gateway over real mutual TLS (tests/bcd_fake_gateway.py).

The agent runs in-process (NodeAgent.run) so each test can stop and restart it, drop
the connection, or change the fake GPU file; the gateway side is the wire protocol of
api/wire/gateway.py with the real PKI. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import io
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from better_compute.agent.gpu import FakeSource, set_fake_gpu_health
from better_compute.agent.node.agent import NodeAgent, NodeOptions
from better_compute.agent.node.backoff import Backoff
from better_compute.agent.node.command import fetch_status
from better_compute.agent.node.devices import bind_devices, unsupported
from better_compute.agent.node.render import render_status
from better_compute.agent.node.settings import load_settings
from better_compute.agent.paths import Paths
from better_compute.api import pki
from tests.bcd_fake_gateway import ACCEPTANCE, NODE_ID, FakeGateway, NodeRoot, make_node_root

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _agent(root: NodeRoot, out: io.StringIO, devices: Any = unsupported) -> NodeAgent:
    settings = load_settings(root.paths.config)
    options = NodeOptions(heartbeat_seconds=0.2, poll_seconds=0.05, report_every=2,
                          backoff=Backoff(base=0.05, cap=0.3), out=out)
    return NodeAgent(settings, root.paths, FakeSource(root.gpu_file), settings.load_key(),
                     options=options, devices=devices)


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll an agent-side condition (no message marks it) under a deadline."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def _setup(tmp_path: Path, gpus: int = 8) -> tuple[FakeGateway, NodeRoot]:
    bundle = pki.generate_bundle()
    gateway_dir = tmp_path / "gw"
    gateway_dir.mkdir()
    # The port is known only once the gateway listens; the URL is rewritten then.
    root = make_node_root(tmp_path / "n", bundle, "tls://127.0.0.1:1", gpus=gpus)
    gateway = FakeGateway(bundle, root.key.public_key(), gateway_dir)
    return gateway, root


def _point_at(root: NodeRoot, port: int) -> None:
    config = root.paths.config
    config.write_text(config.read_text().replace("tls://127.0.0.1:1", f"tls://127.0.0.1:{port}"))


async def _status(paths: Paths) -> dict[str, Any]:
    return await anyio.to_thread.run_sync(fetch_status, paths.socket)


async def test_acceptance_passes_journals_once_and_status_shows_the_node(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    out = io.StringIO()
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        await group.start(_agent(root, out).run)
        await gateway.wait_for(lambda: 1 in gateway.accepted and gateway.last_report is not None
                               and gateway.last_report.applied_generation == 1)
        entry = gateway.accepted[1]
        assert entry["kind"] == "acceptance.result" and entry["passed"] is True
        assert entry["nodeId"] == NODE_ID and entry["epoch"] == 1 and entry["attempt"] == 1
        assert len(entry["gpus"]) == 8
        assert gateway.hellos[0].node_id == NODE_ID
        await gateway.wait_for(lambda: len(gateway.heartbeats) >= 2)
        assert {beat.epoch for beat in gateway.heartbeats} == {1}
        report = gateway.report
        assert report.sections["acceptance"].state == "passed"
        assert report.inventory is not None and len(report.inventory.gpus) == 8
        assert report.telemetry is not None and len(report.telemetry.gpus) == 8

        status = await _status(root.paths)
        assert status["session"]["state"] == "connected" and status["session"]["epoch"] == 1
        assert status["spec"] == {"appliedGeneration": 1, "observedGeneration": 1}
        assert status["sections"]["acceptance"]["state"] == "passed"
        assert len(status["gpus"]) == 8 and status["gpus"][0]["heldBy"] is None
        await _until(lambda: root.paths.under("var/lib/bcd/journal.jsonl").read_text()
                     .count('"settled"') == 1)
        text = render_status(await _status(root.paths))
        assert f"node     {NODE_ID}" in text
        assert "session  connected (epoch 1)" in text
        assert "applied generation 1, observed generation 1" in text
        assert "section  acceptance: passed: attempt 1: 8 healthy H100 GPUs, expected 8" in text
        assert sum(line.startswith("gpu ") for line in text.splitlines()) == 8
        assert "util 0%" in text and "mem 0/81559 MiB" in text
        group.cancel_scope.cancel()
    assert "bcd node: session connected (epoch 1)" in out.getvalue()
    assert not root.paths.socket.exists()  # removed on the way out


async def test_a_failed_acceptance_is_sticky_until_a_new_attempt(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    set_fake_gpu_health(root.gpu_file, 3, healthy=False, reasons=["xid-79"])
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        await group.start(_agent(root, io.StringIO()).run)
        await gateway.wait_for(lambda: 1 in gateway.accepted)
        failed = gateway.accepted[1]
        assert failed["passed"] is False
        message = failed["checks"][0]["message"]
        assert "7 healthy H100 GPUs, expected 8" in message and "GPU 3" in message
        assert "xid-79" in message

        # The GPU is fixed, but the same attempt (a resend, a new generation) is not rerun.
        set_fake_gpu_health(root.gpu_file, 3, healthy=True)
        await gateway.push(2, {"acceptance": ACCEPTANCE})
        await gateway.wait_for(lambda: gateway.report.applied_generation == 2)
        assert list(gateway.accepted) == [1]
        assert gateway.report.sections["acceptance"].state == "failed"

        await gateway.push(3, {"acceptance": ACCEPTANCE | {"attempt": 2}})
        await gateway.wait_for(lambda: 2 in gateway.accepted)
        assert gateway.accepted[2]["passed"] is True and gateway.accepted[2]["attempt"] == 2
        await gateway.wait_for(lambda: gateway.report.applied_generation == 3)
        assert gateway.report.sections["acceptance"].state == "passed"
        group.cancel_scope.cancel()


async def test_reconnects_with_a_higher_epoch_and_resends_unacknowledged_entries(
        tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    gateway.hold_acks = True
    out = io.StringIO()
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        agent = _agent(root, out)
        await group.start(agent.run)
        await gateway.wait_for(lambda: (1, 1) in gateway.received)
        gateway.hold_acks = False
        await gateway.drop()  # the network drops: no answer, the connection is gone
        await gateway.wait_for(lambda: (2, 1) in gateway.received)  # same entry, next epoch
        assert gateway.hellos[-1].applied_generation == 1
        await _until(lambda: not agent.journal.unsettled())
        assert agent.session.state == "connected" and agent.session.epoch == 2

        gateway.stop()  # the whole gateway dies ...
        await _until(lambda: agent.session.state == "disconnected")
        status = await _status(root.paths)
        assert status["session"]["state"] == "disconnected" and status["session"]["lastError"]
        assert "disconnected (last epoch 2)" in render_status(status)
        await group.start(gateway.serve)  # ... and comes back on the same port
        await gateway.wait_for(lambda: gateway.epoch == 3 and len(gateway.heartbeats) > 0
                               and gateway.heartbeats[-1].epoch == 3)
        assert list(gateway.accepted) == [1]  # applied once, whatever the reconnects
        group.cancel_scope.cancel()
    lines = out.getvalue()
    assert "session connected (epoch 2)" in lines and "session connected (epoch 3)" in lines
    assert "reconnecting in" in lines


async def test_a_restarted_agent_resumes_where_it_was(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    gateway.hold_acks = True
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        async with anyio.create_task_group() as first:
            await first.start(_agent(root, io.StringIO()).run)
            await gateway.wait_for(lambda: 1 in gateway.accepted)
            first.cancel_scope.cancel()  # bcd stops before the gateway acknowledged
        gateway.hold_acks = False
        second = _agent(root, io.StringIO())
        assert second.state.applied_generation == 1  # from its own state file
        assert second.state.sections["acceptance"].state == "passed"
        await group.start(second.run)
        await gateway.wait_for(lambda: len(gateway.hellos) == 2)
        assert gateway.hellos[1].applied_generation == 1
        assert gateway.hellos[1].observed_generation == 1
        await _until(lambda: not second.journal.unsettled())
        assert [seq for _, seq in gateway.received] == [1, 1]  # resent, never re-run
        assert len(second.journal.entries()) == 1
        group.cancel_scope.cancel()


async def test_an_unhealthy_gpu_or_a_lost_session_never_drops_a_hold(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    uuid = FakeSource(root.gpu_file).inventory().gpus[2].uuid
    gateway.sections = {"acceptance": ACCEPTANCE, "devices": {"assignments": [
        {"allocationId": "alloc_1", "reservationId": "rsv_1", "gpus": [uuid]}]}}
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        agent = _agent(root, io.StringIO(), devices=bind_devices)
        await group.start(agent.run)
        await gateway.wait_for(lambda: any(e["kind"] == "allocation.bound"
                                           for e in gateway.accepted.values()))
        bound = next(e for e in gateway.accepted.values() if e["kind"] == "allocation.bound")
        assert bound["allocationId"] == "alloc_1" and bound["nodeId"] == NODE_ID
        assert bound["cdiDevices"] == [f"bcd.dev/gpu={uuid}"]
        spec = root.paths.cdi / "bcd-alloc_1.json"
        assert spec.exists() and (root.paths.allocations / "alloc_1.env").exists()

        set_fake_gpu_health(root.gpu_file, 2, healthy=False, reasons=["ecc-uncorrected"])
        await gateway.wait_for(lambda: gateway.inventory.gpus[2].healthy is False)
        status = await _status(root.paths)
        assert status["gpus"][2]["healthy"] is False and status["gpus"][2]["heldBy"] == "alloc_1"
        assert "held by alloc_1" in render_status(status)

        gateway.stop()
        await _until(lambda: agent.session.state == "disconnected")
        assert (await _status(root.paths))["holds"] == {uuid: "alloc_1"}

        set_fake_gpu_health(root.gpu_file, 2, healthy=True)  # recovers: no restart needed
        await _until(lambda: agent.inventory is not None and agent.inventory.gpus[2].healthy)
        await group.start(gateway.serve)
        await gateway.wait_for(lambda: gateway.epoch == 2 and gateway.last_report is not None
                               and gateway.last_report.epoch == 2)
        assert gateway.inventory.gpus[2].healthy is True
        assert agent.state.holds == {uuid: "alloc_1"}
        # The assignment leaves the desired state: only then is the hold released.
        await gateway.push(2, {"acceptance": ACCEPTANCE, "devices": {"assignments": []}})
        await gateway.wait_for(lambda: any(e["kind"] == "allocation.released"
                                           for e in gateway.accepted.values()))
        assert agent.state.holds == {} and not spec.exists()
        assert [e["kind"] for e in gateway.accepted.values()].count("allocation.bound") == 1
        group.cancel_scope.cancel()


async def test_devices_without_a_binding_module_say_so(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    gateway.sections = {"devices": {"assignments": [
        {"allocationId": "alloc_1", "reservationId": "rsv_1", "gpus": ["GPU-x"]}]},
        "firmware": {"version": 2}}
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        await group.start(_agent(root, io.StringIO(), devices=unsupported).run)
        await gateway.wait_for(lambda: gateway.last_report is not None
                               and gateway.last_report.applied_generation == 1)
        sections = gateway.report.sections
        assert sections["devices"].state == "unsupported"
        assert "not supported by this bcd yet" in sections["devices"].message
        assert sections["firmware"].state == "unsupported"
        assert gateway.accepted == {}
        group.cancel_scope.cancel()


async def test_a_refused_session_is_retried_and_reported(tmp_path: Path) -> None:
    gateway, root = _setup(tmp_path)
    gateway.refuse_node = "node-retired"
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        agent = _agent(root, io.StringIO())
        await group.start(agent.run)
        await gateway.wait_for(lambda: len(gateway.hellos) >= 2)  # it kept trying, backing off
        await _until(lambda: agent.session.last_error is not None)
        status = await _status(root.paths)
        assert status["session"]["state"] == "connecting"
        assert "node-retired" in status["session"]["lastError"]
        group.cancel_scope.cancel()


async def test_a_refused_connect_backs_off_to_the_cap_and_a_welcome_starts_again(
        tmp_path: Path) -> None:
    """No gateway listens (the server restarts): each refused connect waits twice as long as
    the one before, up to the cap; once a session is welcomed, the next drop waits from the
    bottom again."""
    gateway, root = _setup(tmp_path)
    with socket.socket() as closed:  # a port nobody listens on: connects are refused
        closed.bind(("127.0.0.1", 0))
        gateway.port = closed.getsockname()[1]
    _point_at(root, gateway.port)
    out = io.StringIO()
    agent = _agent(root, out)
    agent.options.backoff = Backoff(base=0.1, cap=0.4, random=lambda: 1.0)  # the window's top

    def delays() -> list[str]:
        return re.findall(r"reconnecting in ([0-9.]+)s", out.getvalue())

    async with anyio.create_task_group() as group:
        await group.start(agent.run)
        await _until(lambda: len(delays()) >= 4)
        assert delays()[:4] == ["0.1", "0.2", "0.4", "0.4"]
        assert "Connect call failed" in out.getvalue() or "refused" in out.getvalue()
        await group.start(gateway.serve)  # the server is back on its port
        await gateway.wait_for(lambda: len(gateway.heartbeats) > 0)
        assert agent.options.backoff.failures == 0
        seen = len(delays())
        await gateway.drop()
        await _until(lambda: len(delays()) > seen)
        assert delays()[seen] == "0.1"
        group.cancel_scope.cancel()


async def test_an_entry_nacked_unavailable_is_sent_again_in_the_same_session(
        tmp_path: Path) -> None:
    """The control plane's store was away when the entry came: bcd keeps it and sends it
    again a heartbeat later, without waiting for a new session (the session stays up)."""
    gateway, root = _setup(tmp_path)
    gateway.nack_unavailable = 2
    async with anyio.create_task_group() as group:
        _point_at(root, await group.start(gateway.serve))
        agent = _agent(root, io.StringIO())
        await group.start(agent.run)
        await gateway.wait_for(lambda: 1 in gateway.accepted)
        assert gateway.received == [(1, 1), (1, 1), (1, 1)]  # nacked twice, then acked
        await _until(lambda: not agent.journal.unsettled())
        assert agent.session.epoch == 1 and len(gateway.hellos) == 1
        group.cancel_scope.cancel()


async def test_a_gateway_that_never_finishes_the_handshake_is_left_and_tried_again(
        tmp_path: Path) -> None:
    """A gateway that accepts the connection and never answers the TLS handshake (a stuck
    process, a load balancer that black-holes) ends the attempt after the Welcome timeout
    with a line that says so, and bcd connects again: it does not wait forever."""
    _, root = _setup(tmp_path)
    accepted: list[Any] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    _point_at(root, port)

    async def silent(stream: Any) -> None:
        accepted.append(stream)  # held open, never read from or written to
        await anyio.sleep_forever()

    out = io.StringIO()
    agent = _agent(root, out)
    agent.options.welcome_timeout = 0.5
    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, silent)
        await group.start(agent.run)
        await _until(lambda: len(accepted) >= 2)  # left the first, connected again
        assert "session lost: the gateway accepted the connection and did not complete " \
               "the TLS handshake within 0.5s" in out.getvalue()
        assert agent.session.last_error is not None
        group.cancel_scope.cancel()
