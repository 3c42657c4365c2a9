"""The gateway end to end in one process, on each backend, with a client that speaks the wire.

The node is joined through nodes.join (its key made here, never sent), the
gateway runs on loopback with mutual TLS, and the NodeLifecycle controller
runs one pass at a time on a fake clock: nothing here sleeps for time to pass.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from typing import Any

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.api.net import Handshakes
from better_compute.api.wire import gateway as wire
from better_compute.domain.access import LOCAL_OPERATOR
from tests.gateway_client import (
    NodeClient,
    Plane,
    client_context,
    gpus,
    run_with_gateway,
    wait_for,
)

HELLO = 1.0  # seconds: the hello (and handshake) timeout where a test sets it


def test_a_node_is_adopted_over_its_session(env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        welcome = await client.connect()
        assert isinstance(welcome, wire.Welcome) and welcome.epoch == 1
        first = await client.receive_desired()
        assert first.generation == 0 and "acceptance" not in first.sections

        passed = await plane.reconcile()
        assert passed.acceptance_started == [node.node_id]
        checks = await client.receive_desired(lambda d: "acceptance" in d.sections)
        section = checks.sections["acceptance"]
        assert section["attempt"] == 1 and checks.generation == 0
        assert section["checks"] == [{"kind": "diag.nvml",
                                      "expect": {"gpuCount": 8, "gpuModel": "H100"}}]

        answer = await client.acceptance(1, gpus(8))
        assert isinstance(answer, wire.Ack)
        adopted = await client.receive_desired(lambda d: d.generation == 1)
        assert adopted.sections == {"devices": {"assignments": []}}

        doc = plane.node(node.node_id)
        assert doc["provisionState"] == "adopted" and doc["generation"] == 1
        conditions = {c["type"]: c["status"] for c in doc["conditions"]}
        assert conditions == {"Connected": "True", "AcceptancePassed": "True",
                              "Healthy": "True", "Schedulable": "True",
                              "InventoryMatches": "True"}
        assert plane.event_types(node.node_id) == [
            "node.joined", "node.connected", "node.acceptance.started", "node.adopted"]
        capacity = plane.capacity()
        assert (capacity["total"], capacity["allocatable"], capacity["available"]) == (8, 8, 8)
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_a_change_recorded_while_the_session_opens_still_goes_down(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller starts acceptance after the session's node.connected is saved and
    before the session is in the gateway's table (under load: a fleet connecting at once),
    and the event's wake-up finds no session: the session still sends the checks."""
    async def body(plane: Plane) -> None:
        node = plane.join()
        assert plane.gateway is not None
        gateway = plane.gateway
        seen: list[bytes] = []
        real_poke = gateway._poke_for

        def poke_for(line: bytes) -> None:
            seen.append(line)
            real_poke(line)

        monkeypatch.setattr(gateway, "_poke_for", poke_for)
        real_sections = plane.nodes.pool_sections

        def sections_after_a_change(n: object) -> object:
            started = plane.lifecycle.reconcile().acceptance_started
            assert started == [node.node_id]
            with anyio.from_thread.start_blocking_portal() as portal:
                portal.call(wait_for, lambda: any(b"node.acceptance.started" in line
                                                  for line in seen))
            return real_sections(n)  # type: ignore[arg-type]

        monkeypatch.setattr(plane.nodes, "pool_sections", sections_after_a_change)
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        checks = await client.receive_desired(lambda d: "acceptance" in d.sections)
        assert checks.sections["acceptance"]["attempt"] == 1
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_seven_healthy_gpus_fail_until_nodes_adopt(env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.start_acceptance()
        answer = await client.acceptance(1, gpus(8, healthy=7))
        assert isinstance(answer, wire.Ack)  # accepted as a result: the result is a failure
        doc = plane.node(node.node_id)
        assert doc["provisionState"] == "adopting"
        assert doc["acceptance"]["state"] == "failed"
        assert "7 healthy H100 GPUs, expected 8" in doc["acceptance"]["message"]

        again = await plane.reconcile()  # sticky: the controller starts nothing
        assert again.acceptance_started == []
        assert plane.capacity()["provisioning"] == 8 and plane.capacity()["allocatable"] == 0

        await anyio.to_thread.run_sync(
            lambda: plane.nodes.adopt(LOCAL_OPERATOR, "root", node.node_id, "GPU 3 reseated"))
        retry = await client.receive_desired(
            lambda d: d.sections.get("acceptance", {}).get("attempt") == 2)
        assert retry.sections["acceptance"]["state"] == "running"
        assert isinstance(await client.acceptance(2, gpus(8)), wire.Ack)
        assert plane.node(node.node_id)["provisionState"] == "adopted"
        assert plane.event_types(node.node_id) == [
            "node.joined", "node.connected", "node.acceptance.started",
            "node.acceptance.failed", "node.acceptance.started", "node.adopted"]
        events = plane.nodes.events(LOCAL_OPERATOR, node.node_id)
        assert events[4]["data"]["reason"] == "GPU 3 reseated"
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_an_entry_signed_by_another_key_changes_nothing(env: dict[str, str],
                                                        tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.start_acceptance()
        before = plane.event_types(node.node_id)
        forged = await client.acceptance(1, gpus(8), key=ec.generate_private_key(ec.SECP256R1()))
        assert isinstance(forged, wire.Nack) and forged.code == "bad_signature"
        assert plane.event_types(node.node_id) == before
        assert plane.node(node.node_id)["acceptance"]["state"] == "running"
        stale = await client.journal({"kind": "acceptance.result", "attempt": 1})
        assert isinstance(stale, wire.Ack | wire.Nack)
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_an_entry_that_does_not_fit_its_kind_is_refused_and_changes_nothing(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.start_acceptance()
        before = plane.event_types(node.node_id)
        misfit = await client.journal({"kind": "acceptance.result", "attempt": "one",
                                       "passed": True, "gpus": gpus(8)})
        assert isinstance(misfit, wire.Nack) and misfit.code == "invalid_input"
        assert "$.attempt" in misfit.message
        unknown = await client.journal({"kind": "firmware.flashed", "attempt": 1})
        assert isinstance(unknown, wire.Nack) and unknown.code == "unknown_kind"
        assert plane.event_types(node.node_id) == before
        assert plane.node(node.node_id)["acceptance"]["state"] == "running"
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_stolen_config_without_the_node_key_cannot_connect(env: dict[str, str],
                                                           tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        other = plane.join(serial="SN-7702")
        # The certificate without its key: TLS cannot even be set up with it.
        thief_key = ec.generate_private_key(ec.SECP256R1())
        stolen = plane.write_identity(node.node_id, thief_key, node.cert_pem)
        with pytest.raises(ssl.SSLError):
            client_context(plane, stolen)
        # No client certificate at all: the handshake is refused.
        bare = NodeClient(plane, node, context=client_context(plane, None))
        with pytest.raises((ssl.SSLError, OSError, anyio.BrokenResourceError,
                            anyio.EndOfStream, anyio.IncompleteRead)):
            await bare.connect()
        # Another node's certificate and key, claiming to be this node: refused.
        liar = NodeClient(plane, other, hello_id=node.node_id)
        refused = await liar.connect()
        assert isinstance(refused, wire.Refused) and refused.code == "wrong_node"
        assert plane.event_types(node.node_id) == ["node.joined"]

    run_with_gateway(env, tmp_path, body)


def test_a_new_session_fences_the_old_one_and_silence_is_unreachable(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        first = NodeClient(plane, node)
        await first.start_acceptance()
        await first.acceptance(1, gpus(8))

        second = NodeClient(plane, node)
        welcome = await second.connect()
        assert isinstance(welcome, wire.Welcome) and welcome.epoch == 2
        assert await first.closed_by_peer()
        assert plane.node(node.node_id)["session"]["epoch"] == 2
        assert "node.disconnected" not in plane.event_types(node.node_id)  # fenced, not ended

        await second.close()
        await wait_for(lambda: plane.node(node.node_id)["session"]["state"] == "disconnected")
        assert plane.capacity()["allocatable"] == 8  # within the timeout: still counted
        plane.clock.advance(29)
        assert (await plane.reconcile()).unreachable == []
        plane.clock.advance(2)
        assert (await plane.reconcile()).unreachable == [node.node_id]
        capacity = plane.capacity()
        assert (capacity["unreachable"], capacity["allocatable"]) == (8, 0)
        conditions = {c["type"]: c for c in plane.node(node.node_id)["conditions"]}
        assert conditions["Schedulable"]["reason"] == "Unreachable"

        third = NodeClient(plane, node)
        welcome = await third.connect()
        assert isinstance(welcome, wire.Welcome) and welcome.epoch == 3
        assert plane.capacity()["allocatable"] == 8
        assert plane.event_types(node.node_id)[-3:] == [
            "node.disconnected", "node.unreachable", "node.connected"]
        await third.close()

    run_with_gateway(env, tmp_path, body)


def test_heartbeats_keep_a_connected_node_reachable(env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.connect()
        assert plane.gateway is not None
        for _ in range(4):
            plane.clock.advance(20)
            await client.send(wire.Heartbeat(epoch=client.epoch, time="2030-01-01T00:00:00Z"))
            await wait_for(lambda: plane.gateway is not None and bool(plane.gateway.beats))
            await plane.gateway.flush_heartbeats()
            assert (await plane.reconcile()).unreachable == []
        plane.clock.advance(31)
        assert (await plane.reconcile()).unreachable == [node.node_id]
        assert await client.closed_by_peer()  # bcd reconnects with a new epoch

        again = NodeClient(plane, node)
        assert isinstance(await again.connect(), wire.Welcome) and again.epoch == 2
        await again.receive_desired()
        # A heartbeat of another epoch is refused and ends the session.
        await again.send(wire.Heartbeat(epoch=1, time="2030-01-01T00:00:00Z"))
        refused = await again.receive()
        assert isinstance(refused, wire.Refused) and refused.code == "stale_epoch"
        assert await again.closed_by_peer()

    run_with_gateway(env, tmp_path, body)


def test_gpu_health_follows_reports_and_never_drops_capacity_twice(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.start_acceptance()
        await client.acceptance(1, gpus(8))
        sick = gpus(8, healthy=8)
        sick[2] = {**sick[2], "healthy": False, "healthReasons": ["ecc-uncorrected"]}
        await client.report(sick, applied=1)
        await wait_for(lambda: "node.gpu.unhealthy" in plane.event_types(node.node_id))
        capacity = plane.capacity()
        assert (capacity["unhealthy"], capacity["allocatable"]) == (1, 7)
        conditions = {c["type"]: c for c in plane.node(node.node_id)["conditions"]}
        assert conditions["Healthy"]["status"] == "False"
        assert "ecc-uncorrected" in conditions["Healthy"]["message"]
        await client.report(sick, applied=1)  # the same state again records nothing
        await client.report(gpus(8), applied=1)
        await wait_for(lambda: "node.gpu.healthy" in plane.event_types(node.node_id))
        assert plane.event_types(node.node_id).count("node.gpu.unhealthy") == 1
        assert plane.capacity()["allocatable"] == 8
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_a_silent_session_is_closed_and_says_why(env: dict[str, str], tmp_path: Path) -> None:
    """A session that hears nothing for max(3 heartbeats, min_idle) of real time is dead: the
    gateway closes it and records why (bcd heartbeats, so only a lost connection is silent)."""
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        assert await client.closed_by_peer()
        await wait_for(lambda: plane.node(node.node_id)["session"]["state"] != "connected")
        events = plane.nodes.events(LOCAL_OPERATOR, node.node_id)
        assert [e["type"] for e in events] == ["node.joined", "node.connected",
                                               "node.disconnected"]
        assert events[-1]["data"]["reason"] == "nothing heard for 1s"

    run_with_gateway(env, tmp_path, body, heartbeat_seconds=0.1, min_idle=1.0)


def test_a_connection_that_never_finishes_its_tls_handshake_is_let_go(
        env: dict[str, str], tmp_path: Path) -> None:
    """The gateway's port faces every network nodes are on. A TCP connection that never
    sends its ClientHello is let go after the gateway's hello timeout, as the Hello after it
    is (anyio's own handshake timeout is 30 s)."""
    async def body(plane: Plane) -> None:
        assert plane.gateway is not None
        started = anyio.current_time()
        silent = await anyio.connect_tcp("127.0.0.1", plane.gateway.port)
        with anyio.fail_after(HELLO + 10):
            try:
                data = await silent.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                data = b""
        assert data == b"", data
        assert anyio.current_time() - started < HELLO + 10
        await silent.aclose()

    run_with_gateway(env, tmp_path, body, hello_timeout=HELLO)



def test_handshakes_under_way_are_bounded_per_address_and_a_node_is_served(
        env: dict[str, str], tmp_path: Path) -> None:
    """A connection past the handshakes under way of its address is closed before its
    handshake (else one address could hold one per port for the handshake's timeout); past
    the gateway's bound in all, the oldest under way is closed for it (api/net.py
    ``Handshakes``, the API's rule too), so silent connections from many addresses cannot
    keep a node out."""
    async def ended(stream: Any) -> bool:
        with anyio.fail_after(10):  # the handshake's timeout is 60 s here
            try:
                return bool(await stream.receive() == b"")
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return True

    async def held(stream: Any) -> bool:
        with anyio.move_on_after(0.2):
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError,
                                     ConnectionResetError):
                await stream.receive()
            return False
        return True

    async def body(plane: Plane) -> None:
        assert plane.gateway is not None
        port = plane.gateway.port
        first = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(2)]
        assert await ended(await anyio.connect_tcp("127.0.0.1", port))  # past its address's
        # The gateway's own bound (3): one from another address fills it, one more from a
        # third takes the place of the oldest, which is closed.
        second = await anyio.connect_tcp("127.0.0.1", port, local_host="127.0.0.2")
        third = await anyio.connect_tcp("127.0.0.1", port, local_host="127.0.0.3")
        assert await ended(first[0])
        assert await held(first[1]) and await held(second) and await held(third)
        # A node is welcomed at once, in the place of the next oldest.
        welcome = await NodeClient(plane, plane.join()).connect()
        assert isinstance(welcome, wire.Welcome), welcome
        assert await ended(first[1])
        for stream in [*first, second, third]:
            await stream.aclose()

    run_with_gateway(env, tmp_path, body, hello_timeout=60,
                     handshakes=Handshakes(3, 2, settings=("gateway.max_handshakes",
                                                           "gateway.max_handshakes_per_address")))


def test_a_stopping_replica_hands_its_sessions_back_recording_nothing(
        env: dict[str, str], tmp_path: Path) -> None:
    """serve stops (SIGTERM, after its drain): the gateway tells each agent it is stopping
    and ends the session without recording a disconnect (the agent reconnects at once,
    through the load balancer, to another replica, whose session supersedes this one), and
    refuses new sessions meanwhile, so they go elsewhere too."""
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        await client.receive_desired()
        before = plane.event_types(node.node_id)
        assert plane.gateway is not None
        await plane.gateway.hand_back()
        refused = await client.receive()
        assert isinstance(refused, wire.Refused) and refused.code == "unavailable"
        assert "stopping" in refused.message
        assert await client.closed_by_peer()
        await wait_for(lambda: plane.gateway is not None and not plane.gateway.sessions)
        assert plane.event_types(node.node_id) == before  # no node.disconnected
        assert plane.node(node.node_id)["session"]["state"] == "connected"

        again = NodeClient(plane, node)
        refused = await again.connect()
        assert isinstance(refused, wire.Refused) and refused.code == "unavailable"
        assert plane.event_types(node.node_id) == before  # no new epoch either

    run_with_gateway(env, tmp_path, body)


class _Leads:
    """A leadership always held (this test's process is the only one)."""

    def try_acquire(self) -> bool:
        return True

    def still_leader(self) -> bool:
        return True

    def release(self) -> None:
        pass


def test_a_new_leader_counts_no_silence_from_before_it_led(
        env: dict[str, str], tmp_path: Path) -> None:
    """After a database failover another replica may take the controllers. Its first pass
    saw heartbeats no gateway could write while the store was away (two minutes old here):
    it marked every node unreachable at once, and creates answered no_capacity until the
    agents reconnected (seen in benchmarks/ha.py). A new leader counts silence only from
    its first pass on, as one that lost the store does."""
    from functools import partial
    from types import SimpleNamespace

    from better_compute.api.controllers.runner import run_controllers

    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        await client.receive_desired()
        plane.clock.advance(120)
        state = SimpleNamespace(runtime=plane.runtime, extra={})
        async with anyio.create_task_group() as tg:
            await tg.start(partial(run_controllers, leadership=_Leads()), state)
            # The first pass starts the node's acceptance, and looks at its silence.
            await wait_for(lambda: "node.acceptance.started" in plane.event_types(node.node_id))
            assert "node.unreachable" not in plane.event_types(node.node_id)
            plane.clock.advance(31)  # silence this leader saw for itself
            await wait_for(lambda: "node.unreachable" in plane.event_types(node.node_id))
            tg.cancel_scope.cancel()
        await client.close()

    run_with_gateway(env, tmp_path, body)
