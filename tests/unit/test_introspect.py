"""api/http/introspect.py: a task's report names every coroutine of its await chain."""

from __future__ import annotations

import asyncio

from better_compute.api.http.introspect import tasks_report


async def _innermost(event: asyncio.Event) -> None:
    await event.wait()


async def _middle(event: asyncio.Event) -> None:
    await _innermost(event)


def test_the_report_shows_each_task_and_its_whole_await_chain() -> None:
    async def main() -> str:
        event = asyncio.Event()
        task = asyncio.create_task(_middle(event), name="the-waiter")
        await asyncio.sleep(0)  # the task runs to its wait
        report = tasks_report()
        event.set()
        await task
        return report

    report = asyncio.run(main())
    assert "2 task(s) on the event loop:" in report, report
    waiter = report.split("task the-waiter:", 1)[1]
    lines = [line.strip() for line in waiter.splitlines()[1:4]]
    assert lines[0].endswith("in _middle") and lines[1].endswith("in _innermost"), report
    assert lines[2].endswith("in wait"), report  # asyncio.Event.wait, where it waits
