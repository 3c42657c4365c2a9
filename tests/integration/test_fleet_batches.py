"""A fleet's node changes share saves: the gateway's sessions and the controller's passes.

A fleet that connects at once (a restart of the server, a rack powered on) asks for one
change per node; each is still decided on its own node, with its own actor, its own answer,
and its own retry when another writer got there first, but they are saved a batch at a time
(NodeService.change_each, api/gateway/writes.py). The counts below are of the store's saves,
so they hold however loaded the machine is.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import anyio
import pytest

from better_compute.api.controllers import node_lifecycle
from better_compute.api.store.eventlog import EventLog, filter_for
from better_compute.api.wire import gateway as wire
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.errors import NotFound
from better_compute.domain.ids import parse_id
from better_compute.domain.node import Node
from tests.gateway_client import (
    NodeClient,
    Plane,
    gpus,
    make_plane,
    run_with_gateway,
    running_gateway,
    wait_for,
)

FLEET = 12


def _saves(monkeypatch: pytest.MonkeyPatch, plane: Plane) -> list[list[str]]:
    """The node ids of each save of nodes from now on, in order."""
    saves: list[list[str]] = []
    store = plane.runtime.store
    real = store.save

    def counted(*objs: Any, **kwargs: Any) -> Any:
        nodes = [o.public_id for o in objs if isinstance(o, Node)]
        if nodes:
            saves.append(nodes)
        return real(*objs, **kwargs)

    monkeypatch.setattr(store, "save", counted)
    return saves


def _first_batch_waits(monkeypatch: pytest.MonkeyPatch, plane: Plane, changes: int) -> None:
    """The gateway's next batch waits (in its thread) until the rest of ``changes`` queued
    behind it: they are then one batch, whatever the order the sessions came in."""
    gateway = plane.gateway
    assert gateway is not None
    nodes = plane.nodes
    real = nodes.change_each
    waited: list[int] = []

    def change_each(batch: Any) -> Any:
        if not waited:
            waited.append(len(batch))
            deadline = time.monotonic() + 45
            while len(gateway.writes._queue) < changes - len(batch):
                assert time.monotonic() < deadline, "the other sessions never queued"
                time.sleep(0.01)
        return real(batch)

    monkeypatch.setattr(nodes, "change_each", change_each)


def test_a_fleet_connecting_at_once_shares_saves_and_each_event_is_its_node_s(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(plane: Plane) -> None:
        nodes = [plane.join(serial=f"SN-{i}") for i in range(FLEET)]
        saves = _saves(monkeypatch, plane)
        _first_batch_waits(monkeypatch, plane, FLEET)
        clients = [NodeClient(plane, node) for node in nodes]
        welcomes: list[Any] = []

        async def connect(client: NodeClient) -> None:
            welcomes.append(await client.connect())

        async with anyio.create_task_group() as group:
            for client in clients:
                group.start_soon(connect, client)
        assert all(isinstance(w, wire.Welcome) and w.epoch == 1 for w in welcomes)
        assert sorted(i for ids in saves for i in ids) == sorted(n.node_id for n in nodes)
        assert len(saves) <= 2  # the first (alone or not), the others together
        for node in nodes:  # each node's own event, by the node itself
            connected = [e for e in plane.nodes.events(LOCAL_OPERATOR, node.node_id)
                         if e["type"] == "node.connected"]
            assert [e["actor"] for e in connected] == [node.node_id]

        saves.clear()
        report = await plane.reconcile()  # attempt 1 for all of them: one save
        assert sorted(report.acceptance_started) == sorted(n.node_id for n in nodes)
        assert len(saves) == 1 and len(saves[0]) == FLEET

        saves.clear()
        for client in clients:
            await client.receive_desired(lambda d: "acceptance" in d.sections)
        _first_batch_waits(monkeypatch, plane, FLEET)
        answers: list[Any] = []

        async def accept(client: NodeClient, serial: str) -> None:
            answers.append(await client.acceptance(1, gpus(8, serial=serial)))

        async with anyio.create_task_group() as group:
            for i, client in enumerate(clients):
                group.start_soon(accept, client, f"SN-{i}")
        assert all(isinstance(a, wire.Ack) for a in answers)
        assert sum(len(ids) for ids in saves) == FLEET and len(saves) <= 2
        assert plane.capacity()["allocatable"] == 8 * FLEET
        claimed = EventLog(plane.runtime.store).page(filter_for(LOCAL_OPERATOR, "gpu.claimed"),
                                                     0, 1000).entries
        by_node = {json.loads(e.line)["data"]["nodeId"]: json.loads(e.line)["actor"]
                   for e in claimed}  # the adoption's GPU claims, saved with it, are its own
        assert by_node == {n.node_id: n.node_id for n in nodes}
        assert len(claimed) == 8 * FLEET

        saves.clear()
        for client in clients:
            await client.close()
        await wait_for(lambda: all(plane.node(n.node_id)["session"]["state"] == "disconnected"
                                   for n in nodes))
        assert sum(len(ids) for ids in saves) == FLEET

    run_with_gateway(env, tmp_path, body)


def test_a_batch_answers_each_change_and_a_clash_runs_each_again_alone(
        env: dict[str, str], tmp_path: Path) -> None:
    plane = make_plane(env, tmp_path)
    try:
        nodes = plane.nodes
        joined = [parse_id("node", plane.join(serial=f"SN-{i}").node_id) for i in range(3)]
        missing = UUID(int=7)

        def refuse(node: Node) -> None:
            raise ValueError(f"not {node.public_id}")

        by = "controller:nodes"
        results = nodes.change_each([
            (joined[0], nodes.opening("1.0"), by), (missing, nodes.opening("1.0"), by),
            (joined[1], refuse, by), (joined[0], nodes.closing(1, "gone"), by),
            (joined[2], nodes.opening("1.0"), by)])
        assert results[0] == 1 and results[3] is True and results[4] == 1
        assert isinstance(results[1], NotFound) and isinstance(results[2], ValueError)
        first = nodes.load(joined[0])
        assert first is not None and (first.session, first.session_epoch) == ("disconnected", 1)
        untouched = nodes.load(joined[1])
        assert untouched is not None and untouched.session_epoch == 0

        # Another writer saves node 2 between the batch's read and its save: the batch's
        # save is refused as a whole, and each change runs again alone on what is stored.
        real_load, real_load_each = nodes.load, nodes.load_each
        moved: list[UUID] = []

        def load_then_race(uuids: Any) -> dict[UUID, Node]:
            read = real_load_each(uuids)
            if joined[2] in read and not moved:
                moved.append(joined[2])
                nodes.session_opened(joined[2], "2.0", actor=by)  # epoch 2, saved first
            return read

        nodes.load_each = load_then_race  # type: ignore[method-assign]
        results = nodes.change_each([(joined[1], nodes.opening("1.0"), by),
                                     (joined[2], nodes.opening("1.0"), by)])
        assert results == [1, 3]
        last = real_load(joined[2])
        assert last is not None and last.session_epoch == 3
    finally:
        plane.runtime.close()


def test_a_pass_over_a_heartbeating_fleet_reads_no_node(
        env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes heard within ``unreachable_after`` are left out by the database: the pass reads
    no row of them and loads no node; one that falls silent is read and marked on its own."""
    async def body(plane: Plane) -> None:
        nodes = [plane.join(serial=f"SN-{i}") for i in range(4)]
        clients = [NodeClient(plane, node) for node in nodes]
        for i, client in enumerate(clients):
            await client.start_acceptance()
            await client.acceptance(1, gpus(8, serial=f"SN-{i}"))
        assert plane.gateway is not None
        gateway = plane.gateway

        async def beat(some: list[NodeClient]) -> None:
            for client in some:
                await client.send(wire.Heartbeat(epoch=1, time="2030-01-01T00:00:00Z"))
            await wait_for(lambda: len(gateway.beats) == len(some))
            await gateway.flush_heartbeats()

        plane.clock.advance(20)
        await beat(clients)
        loads: list[UUID] = []  # by the controller's pass (the sessions load their own)
        passing = threading.local()
        real_load, real_reconcile = plane.nodes.load, plane.lifecycle.reconcile
        real_load_each = plane.nodes.load_each

        def counted(uuid: UUID) -> Node | None:
            if getattr(passing, "on", False):
                loads.append(uuid)
            return real_load(uuid)

        def counted_each(uuids: Any) -> dict[UUID, Node]:
            if getattr(passing, "on", False):
                loads.extend(uuids)
            return real_load_each(uuids)

        def reconcile() -> Any:
            passing.on = True
            try:
                return real_reconcile()
            finally:
                passing.on = False

        rows: list[int] = []  # node rows the pass's queries returned
        real_rows = node_lifecycle._rows

        def counted_rows(*args: Any, **kwargs: Any) -> list[Any]:
            got = real_rows(*args, **kwargs)
            rows.append(len(got))
            return got

        monkeypatch.setattr(plane.nodes, "load", counted)
        monkeypatch.setattr(plane.nodes, "load_each", counted_each)
        monkeypatch.setattr(plane.lifecycle, "reconcile", reconcile)
        monkeypatch.setattr(node_lifecycle, "_rows", counted_rows)
        plane.clock.advance(5)
        assert (await plane.reconcile()).unreachable == []
        assert loads == [] and sum(rows) == 0 and rows
        plane.clock.advance(15)
        await beat(clients[1:])  # the first node falls silent
        plane.clock.advance(15)  # 35 s since its last word, 15 s for the others
        rows.clear()
        assert (await plane.reconcile()).unreachable == [nodes[0].node_id]
        assert loads == [parse_id("node", nodes[0].node_id)] and sum(rows) == 1

    run_with_gateway(env, tmp_path, body)


def test_a_server_that_stops_records_no_session_end_and_the_fleet_comes_back(
        env: dict[str, str], tmp_path: Path) -> None:
    """Stopping the server is not each node's session ending: nothing is written per node
    (a restart of a server holding 10,000 sessions wrote 10,000 events before it could stop);
    each node connects again with the next epoch."""
    plane = make_plane(env, tmp_path)
    nodes = [plane.join(serial=f"SN-{i}") for i in range(3)]

    async def main() -> None:
        clients = [NodeClient(plane, node) for node in nodes]
        async with running_gateway(plane):
            for client in clients:
                assert isinstance(await client.connect(), wire.Welcome)
        for client in clients:
            assert await client.closed_by_peer()
        for node in nodes:
            assert plane.event_types(node.node_id) == ["node.joined", "node.connected"]
        async with running_gateway(plane):
            for node in nodes:
                welcome = await NodeClient(plane, node).connect()
                assert isinstance(welcome, wire.Welcome) and welcome.epoch == 2

    try:
        anyio.run(main)
    finally:
        plane.runtime.close()


def test_heartbeats_and_node_writes_are_not_queued_behind_the_sessions_reads(
        env: dict[str, str], tmp_path: Path) -> None:
    """A fleet's adoption wakes every session to read its node: with every thread the sessions
    share taken, a heartbeat flush and a node's change still go through (behind 10,000 reads,
    the flush waited past ``unreachable_after`` and the controller marked a fleet that
    heartbeats unreachable)."""
    async def body(plane: Plane) -> None:
        node = plane.join(serial="SN-0")
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        gateway = plane.gateway
        assert gateway is not None
        await client.send(wire.Heartbeat(epoch=1, time="2030-01-01T00:00:00Z"))
        await wait_for(lambda: len(gateway.beats) == 1)
        held = [object() for _ in range(int(gateway.limiter.total_tokens))]
        for borrower in held:  # every shared thread busy
            await gateway.limiter.acquire_on_behalf_of(borrower)
        try:
            with anyio.fail_after(30):
                assert await gateway.flush_heartbeats() == 1
                closing = plane.nodes.closing(1, "test")
                assert await gateway.writes.change(parse_id("node", node.node_id), closing,
                                                   actor=node.node_id)
        finally:
            for borrower in held:
                gateway.limiter.release_on_behalf_of(borrower)

    run_with_gateway(env, tmp_path, body)
