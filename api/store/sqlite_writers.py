"""One writer at a time across the processes of a SQLite store, each woken at once.

The library lets one thread of a process write at a time. Across processes (the workers of
``serve --workers``, a command line beside a server) SQLite's own busy handler retries a
write that finds the database locked after sleeps of 1, 2, 5, 10, 15, 20, 25 ... ms, so a
write that meets another process's waits tens of milliseconds however short that one is:
with two workers and that handler alone, one client's creates take a median 56-60 ms against
18 ms with one. Here a writer also holds an ``flock`` on
``<database>-writer.lock`` for its transaction, and a process waiting for it checks again
every ``POLL`` seconds (at most a millisecond late). The wait is bounded by the store's lock
timeout: past it the write goes ahead and SQLite's busy timeout decides. The store's
datastore (api/store/sqlite_factory.py) holds it around each writing connection.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POLL = 0.0005  # seconds between two tries of a held lock


class WriterLock:
    """The cross-process writer lock of one SQLite database. Each hold opens the lock file
    anew (the lock belongs to that opening, and closing it lets go): nothing to close
    with the store, and threads exclude each other as processes do."""

    def __init__(self, database: Path, timeout: float) -> None:
        self.path = database.with_name(database.name + "-writer.lock")
        self.timeout = timeout

    @contextmanager
    def held(self) -> Iterator[None]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            flock_within(fd, self.timeout, POLL)  # past it, SQLite's busy timeout decides
            yield
        finally:
            os.close(fd)  # lets go of the lock


def flock_within(fd: int, timeout: float, poll: float) -> bool:
    """Take an exclusive ``flock`` on ``fd``, trying again every ``poll`` seconds while
    another process holds it (the kernel wakes no one: there is no event to wait on);
    False when ``timeout`` seconds passed without it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
