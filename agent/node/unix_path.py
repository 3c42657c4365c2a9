"""Unix socket paths of any length: bind and connect through the folder's file descriptor.

``sockaddr_un`` holds at most 107 bytes of path, so a bcd whose root lies deep in a file
system (a simulated server in a checkout, a test's temporary folder) could neither listen on
nor reach ``run/bcd/status.sock``. Longer paths go through ``/proc/self/fd/N/NAME``, where
N is the socket's folder opened for the moment of the bind or connect: the kernel resolves
the folder by its descriptor, and the socket lands at (or is found at) its real path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SUN_PATH_MAX = 107  # bytes, without the terminating NUL (Linux)


@contextmanager
def reachable(path: Path) -> Iterator[str]:
    """A path to bind or connect ``path``'s socket with, valid inside the block."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        yield str(path)
        return
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{path.name}"
    finally:
        os.close(folder)
