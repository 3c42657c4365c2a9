"""The lifespan's tasks are supervised: a failure after start restarts the task, before
start it fails the server's start-up; ``Retry`` logs a run of failures once."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.abc
import pytest

from better_compute.api.supervise import Retry, supervised


def test_a_task_that_fails_after_it_started_is_started_again() -> None:
    runs: list[int] = []
    done = anyio.Event()

    async def flaky(state: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        runs.append(len(runs))
        task_status.started()  # only the first reaches the task group; the others are no-ops
        if len(runs) < 3:
            raise RuntimeError(f"run {len(runs)} failed")
        done.set()
        await anyio.sleep_forever()

    async def main() -> None:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(supervised, flaky, None)
                await done.wait()  # the server kept going while the task restarted
                tg.cancel_scope.cancel()

    anyio.run(main)
    assert runs == [0, 1, 2]


def test_a_task_that_fails_before_it_started_fails_the_start_up() -> None:
    async def broken(state: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        raise OSError("address already in use")

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(supervised, broken, None)

    with pytest.raises(ExceptionGroup) as caught:
        anyio.run(main)
    assert caught.group_contains(OSError, match="address already in use")


def test_retry_logs_the_first_failure_of_a_run_and_the_recovery(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.retry")
    retry = Retry("writing heartbeats", logger, first=0.1, cap=2.0)
    with caplog.at_level(logging.WARNING, logger="test.retry"):
        delays = [retry.failed(RuntimeError("down")) for _ in range(7)]
        retry.succeeded()
        retry.succeeded()
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0] == "writing heartbeats failed; retrying"
    assert messages[1].startswith("writing heartbeats works again after 7 failures")
