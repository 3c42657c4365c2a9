"""Writing secrets to files: new files only, mode 0600, never overwriting."""

from __future__ import annotations

import os
from pathlib import Path

from better_compute.domain.errors import Conflict, InvalidInput


def check_new_file(path: str | Path, flag: str = "--out") -> Path:
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise Conflict(f"{flag} {target} already exists; it is never overwritten: "
                       "choose a new file name or remove the old file first")
    if not target.parent.is_dir():
        raise InvalidInput(f"{flag} {target}: the folder {target.parent} does not exist")
    return target


def write_new_secret(path: str | Path, text: str, flag: str = "--out") -> Path:
    """Create ``path`` with mode 0600 and write ``text``; refuse if anything is there."""
    target = check_new_file(path, flag)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise Conflict(f"{flag} {target} already exists; it is never overwritten") from None
    with os.fdopen(fd, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    return target
