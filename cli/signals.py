"""Ctrl-C and SIGTERM end the CLI's long-running commands at once, however they were started.

A non-interactive shell starts background jobs with SIGINT ignored, and Python then leaves it
ignored: `events watch` or `reserve --wait` run that way would go on after Ctrl-C (or a
`kill -INT`). ``interruptible()`` asks for both signals explicitly while the command runs:
SIGINT raises KeyboardInterrupt (exit 130), SIGTERM ends the command with exit status 143, in
every state (connected, reconnecting, backing off), since blocking calls are interrupted
either way. The previous handlers come back afterwards (the CLI also runs in-process).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def interruptible() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.SIGTERM: signal.signal(signal.SIGTERM, _terminate)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
