"""What a serving process is waiting on, for one that seems stuck (docs/configuration.md,
"A server that seems stuck").

``kill -USR1 PID`` of any ``serve`` process that serves (the only one, or a worker of
``--workers``) writes every thread's stack (from the signal's handler, in the main thread,
so even with the event loop blocked) and then, from the event loop, one log line with the
server's state and the
await chain of every task on the loop: a request waiting on something shows there, where a
thread dump shows only the idle loop. A shutdown that has not ended after
``SLOW_SHUTDOWN_REPORT`` seconds logs the same line by itself (api/http/serve.py).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("better_compute.serve")


def _frames(awaitable: Any) -> Iterator[FrameType]:
    """The frames of a coroutine and of what it awaits, outermost first (generators and
    async generators too; a future or a C awaitable ends the chain)."""
    seen = 0
    while awaitable is not None and seen < 64:
        seen += 1
        frame = (getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
                 or getattr(awaitable, "ag_frame", None))
        if frame is not None:
            yield frame
        awaitable = (getattr(awaitable, "cr_await", None)
                     or getattr(awaitable, "gi_yieldfrom", None)
                     or getattr(awaitable, "ag_await", None))


def tasks_report(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """Every task of ``loop`` (the running one by default) with its await chain, one
    ``file:line in function`` per frame, innermost last."""
    tasks = asyncio.all_tasks(loop)
    lines = [f"{len(tasks)} task(s) on the event loop:"]
    for task in sorted(tasks, key=lambda t: t.get_name()):
        lines.append(f"  task {task.get_name()}:")
        chain = [f"    {f.f_code.co_filename}:{f.f_lineno} in {f.f_code.co_name}"
                 for f in _frames(task.get_coro())]
        lines.extend(chain or ["    (no Python frame)"])
    return "\n".join(lines)


def thread_stacks() -> str:
    """Every thread's Python stack, most recent call first, the calling thread's marked
    ``Current thread``. Read with the GIL held (``sys._current_frames``): faulthandler's dump
    of all threads reads the others' frames while they run, and once printed garbage and
    then crashed a worker (SIGSEGV) that was saving at that moment."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    parts = []
    for ident, frame in sys._current_frames().items():
        title = "Current thread" if ident == me else "Thread"
        calls = "".join(reversed(traceback.format_stack(frame)))
        parts.append(f"{title} 0x{ident:016x} {names.get(ident, '')} (most recent call first):"
                     f"\n{calls}")
    return "\n".join(parts)


def report_on_signal(state: Callable[[], str], signum: int = signal.SIGUSR1) -> bool:
    """From now on ``signum`` writes every thread's stack to stderr, then logs ``state()``
    and the running loop's tasks. Call from the event loop's thread, the main one (where
    else signals cannot be handled); returns whether it was installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    loop = asyncio.get_running_loop()

    def report() -> None:
        log.warning("state on request (signal %d): %s; %s", signum, state(), tasks_report(loop))

    # The thread stacks at once, from the handler Python runs in the main thread at its next
    # step (even with the loop blocked); the tasks once the loop runs ``report``.
    def on_signal(signum_: int, frame: FrameType | None) -> None:
        sys.stderr.write(thread_stacks() + "\n")
        sys.stderr.flush()
        loop.call_soon_threadsafe(report)

    faulthandler.unregister(signum)  # a worker's until it serves (api/http/workers.py)
    signal.signal(signum, on_signal)
    return True
