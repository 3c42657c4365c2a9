"""The gateway and the NodeLifecycle controller when the store fails under them.

The store fails for real: the presence table is dropped (every write and read of it
fails with the store's own error) and created again, as a store that went away and came
back. The gateway keeps what it could not write; the controller does not count the
silence it could not see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from better_compute.api.store.node_presence import TABLE, Presence
from better_compute.api.wire import gateway as wire
from better_compute.domain.errors import Unavailable
from better_compute.domain.ids import parse_id
from tests.gateway_client import NodeClient, Plane, run_with_gateway, wait_for


def _break_presence(plane: Plane) -> None:
    sql = plane.runtime.store.sql()
    with sql.transaction(commit=True) as cursor:
        cursor.execute("DROP TABLE bc_node_presence")


def _mend_presence(plane: Plane) -> None:
    plane.runtime.store.sql().create_tables([TABLE])


async def _beat(plane: Plane, client: NodeClient) -> None:
    assert plane.gateway is not None
    await client.send(wire.Heartbeat(epoch=client.epoch, time="2030-01-01T00:00:00Z"))
    await wait_for(lambda: plane.gateway is not None and bool(plane.gateway.beats))


def test_a_failed_flush_keeps_the_heartbeats_for_the_next_one(env: dict[str, str],
                                                              tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        gateway = plane.gateway
        assert gateway is not None
        node = plane.join()
        uuid = str(parse_id("node", node.node_id))
        client = NodeClient(plane, node)
        await client.connect()
        await _beat(plane, client)
        await anyio.to_thread.run_sync(_break_presence, plane)
        with pytest.raises(Exception):  # noqa: B017 (the store's own error, whichever backend)
            await gateway.flush_heartbeats()
        kept = dict(gateway.beats)
        assert list(kept) == [uuid]
        await anyio.to_thread.run_sync(_mend_presence, plane)
        assert await gateway.flush_heartbeats() == 1
        seen = await anyio.to_thread.run_sync(Presence(plane.runtime.store.sql()).last_seen)
        assert seen[uuid] == kept[uuid]
        await client.close()

    run_with_gateway(env, tmp_path, body)


def test_silence_while_the_controller_could_not_see_does_not_make_a_node_unreachable(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        gateway = plane.gateway
        assert gateway is not None
        node = plane.join()
        client = NodeClient(plane, node)
        await client.connect()
        await _beat(plane, client)
        await gateway.flush_heartbeats()
        assert (await plane.reconcile()).unreachable == []

        await anyio.to_thread.run_sync(_break_presence, plane)
        with pytest.raises(Exception):  # noqa: B017 (a pass fails: the controller is blind)
            await plane.reconcile()
        plane.clock.advance(60)  # the outage: no heartbeat could be written
        await anyio.to_thread.run_sync(_mend_presence, plane)
        # Back: the first pass does not count the minute it could not see ...
        assert (await plane.reconcile()).unreachable == []
        plane.clock.advance(29)
        assert (await plane.reconcile()).unreachable == []
        # ... but a node that stays silent after it is unreachable as always.
        plane.clock.advance(2)
        assert (await plane.reconcile()).unreachable == [node.node_id]
        assert await client.closed_by_peer()

    run_with_gateway(env, tmp_path, body)


def test_a_store_read_that_fails_while_pushing_keeps_the_session(env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """The session's pusher reads the node when woken; when that read answers ``unavailable``
    the session stays up and pushes the change once the store answers again."""
    async def body(plane: Plane) -> None:
        gateway = plane.gateway
        assert gateway is not None
        node = plane.join()
        client = NodeClient(plane, node)
        await client.connect()
        await client.receive_desired()
        nodes, failures = gateway.nodes, [1]

        class AwayOnce:
            """The gateway's view of the nodes, whose first read fails (the controller's,
            the same service from the composition root, reads as usual)."""

            def __getattr__(self, name: str) -> Any:
                return getattr(nodes, name)

            def load(self, uuid: Any) -> Any:
                if failures:
                    failures.pop()
                    raise Unavailable("the store is away (injected): retry in a few seconds")
                return nodes.load(uuid)

        gateway.nodes = AwayOnce()  # type: ignore[assignment]
        await plane.reconcile()  # starts acceptance: the session is woken to push it
        desired = await client.receive_desired(lambda d: "acceptance" in d.sections)
        assert desired.sections["acceptance"]["attempt"] == 1 and failures == []
        await client.close()

    run_with_gateway(env, tmp_path, body)
