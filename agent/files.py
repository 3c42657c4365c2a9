"""Writing bcd's files atomically: a temp file in the same folder, then a rename."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never half.

    The temp file is created with ``mode`` from the start (a key is never readable by
    others, not even for a moment) and fsynced before the rename.
    """
    payload = data.encode() if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)  # the umask may have narrowed it; never widen past ``mode``
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
        raise
