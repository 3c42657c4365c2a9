"""A wake-up for one waiting task, shared by bcd node's tasks."""

from __future__ import annotations

import anyio


class Pulse:
    """A wake-up for one waiting task: grab :meth:`waiter` BEFORE checking for work.

    A fire between the check and the wait is never lost: the grabbed event is set.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()

    def fire(self) -> None:
        self._event.set()

    def waiter(self) -> anyio.Event:
        if self._event.is_set():
            self._event = anyio.Event()
        return self._event
