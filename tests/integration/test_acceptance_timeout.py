"""An acceptance attempt that never gets a result fails with reason ``timeout``.

The gateway runs in-process with a node that speaks the wire; the NodeLifecycle
controller runs one pass at a time on the fake clock, which the tests move: nothing
here sleeps for time to pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from better_compute.api.controllers.node_lifecycle import ACCEPTANCE_TIMEOUT
from better_compute.api.controllers.runner import acceptance_timeout
from better_compute.api.wire import gateway as wire
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.errors import Conflict, InvalidInput
from tests.gateway_client import NodeClient, Plane, gpus, run_with_gateway


def run(env: dict[str, str], tmp_path: Path, body: Callable[[Plane], Awaitable[None]]) -> None:
    # Only the acceptance timeout is under test: silence never makes these nodes unreachable.
    run_with_gateway(env, tmp_path, body, unreachable_after=timedelta(days=1))


def test_the_default_and_the_setting() -> None:
    assert timedelta(minutes=10) == ACCEPTANCE_TIMEOUT
    assert acceptance_timeout({}) == timedelta(minutes=10)
    assert acceptance_timeout({"BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT": "90"}) == \
        timedelta(seconds=90)
    assert acceptance_timeout({"BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT": "2m"}) == \
        timedelta(minutes=2)
    for bad in ("soon", "0", "-5"):
        with pytest.raises(InvalidInput, match="BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT"):
            acceptance_timeout({"BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT": bad})


def test_an_unanswered_attempt_times_out_sticky_until_nodes_adopt(env: dict[str, str],
                                                                   tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.connect()
        assert (await plane.reconcile()).acceptance_started == [node.node_id]
        await client.receive_desired(lambda d: "acceptance" in d.sections)

        plane.clock.advance(ACCEPTANCE_TIMEOUT.total_seconds() - 1)
        assert (await plane.reconcile()).acceptance_timed_out == []
        assert plane.node(node.node_id)["acceptance"]["state"] == "running"

        plane.clock.advance(2)
        passed = await plane.reconcile()
        assert passed.acceptance_timed_out == [node.node_id]
        doc = plane.node(node.node_id)
        assert doc["provisionState"] == "adopting"
        acceptance = doc["acceptance"]
        assert (acceptance["state"], acceptance["failureReason"]) == ("failed", "timeout")
        assert "no acceptance result within 600s" in acceptance["message"]
        assert "nodes.adopt" in acceptance["message"]
        condition = {c["type"]: c for c in doc["conditions"]}["AcceptancePassed"]
        assert (condition["status"], condition["reason"]) == ("False", "TimedOut")
        failed = plane.nodes.events(LOCAL_OPERATOR, node.node_id)[-1]
        assert failed["type"] == "node.acceptance.failed"
        assert (failed["data"]["attempt"], failed["data"]["reason"]) == (1, "timeout")
        # bcd is told: the section goes down as failed.
        down = await client.receive_desired(
            lambda d: d.sections.get("acceptance", {}).get("state") == "failed")
        assert down.sections["acceptance"]["attempt"] == 1

        # Sticky: more passes start and fail nothing.
        before = plane.event_types(node.node_id)
        plane.clock.advance(ACCEPTANCE_TIMEOUT.total_seconds() * 3)
        again = await plane.reconcile()
        assert (again.acceptance_started, again.acceptance_timed_out) == ([], [])
        # A late result for the timed-out attempt is answered but changes nothing.
        late = await client.acceptance(1, gpus(8))
        assert isinstance(late, wire.Ack)
        assert plane.event_types(node.node_id) == before
        assert plane.node(node.node_id)["provisionState"] == "adopting"

        # nodes.adopt starts attempt 2, whose clock starts afresh.
        await anyio.to_thread.run_sync(
            lambda: plane.nodes.adopt(LOCAL_OPERATOR, "root", node.node_id, "bcd restarted"))
        await client.receive_desired(
            lambda d: d.sections.get("acceptance", {}).get("attempt") == 2)
        plane.clock.advance(ACCEPTANCE_TIMEOUT.total_seconds() / 2)
        assert (await plane.reconcile()).acceptance_timed_out == []
        assert isinstance(await client.acceptance(2, gpus(8)), wire.Ack)
        plane.clock.advance(ACCEPTANCE_TIMEOUT.total_seconds() * 2)
        assert (await plane.reconcile()).acceptance_timed_out == []
        assert plane.node(node.node_id)["provisionState"] == "adopted"
        assert plane.event_types(node.node_id) == [
            "node.joined", "node.connected", "node.acceptance.started",
            "node.acceptance.failed", "node.acceptance.started", "node.adopted"]
        await client.close()

    run(env, tmp_path, body)


def test_an_attempt_times_out_while_the_node_is_away(env: dict[str, str],
                                                     tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        node = plane.join()
        client = NodeClient(plane, node)
        await client.start_acceptance()
        await client.close()  # bcd went away before it ran the checks
        plane.clock.advance(ACCEPTANCE_TIMEOUT.total_seconds() + 1)
        assert (await plane.reconcile()).acceptance_timed_out == [node.node_id]
        assert plane.node(node.node_id)["acceptance"]["failureReason"] == "timeout"
        # A second attempt while one runs is refused; after the failure it is allowed.
        await anyio.to_thread.run_sync(
            lambda: plane.nodes.adopt(LOCAL_OPERATOR, "root", node.node_id, "retry"))
        with pytest.raises(Conflict, match="still running"):
            await anyio.to_thread.run_sync(
                lambda: plane.nodes.adopt(LOCAL_OPERATOR, "root", node.node_id, "again"))

    run(env, tmp_path, body)
