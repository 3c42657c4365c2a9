"""Key files under ``DATA_DIR/run/``: TLS certificates and keys on their way to the ssl module.

The ssl module loads a certificate and its key from files only. ``serve`` writes its serving
certificate and key as ``serving-PID.crt`` and ``serving-PID.key``, the gateway its own in a
folder ``gateway-PID-…``, each private (0600 in a 0700 folder), and removes them as soon as
the TLS context has read them, before the first connection is accepted (docs/security.md,
"Serving certificate"). Only a process killed between writing and reading (SIGKILL, a power
cut) leaves one behind: ``remove_stale`` removes those whose process no longer runs, at every
start.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger("better_compute.serve")

# serving-PID.crt, serving-PID.key, gateway-PID-RANDOM (a folder)
_OWNED = re.compile(r"(?:serving-(\d+)\.(?:crt|key)|gateway-(\d+)-[A-Za-z0-9_]+)\Z")


def write_private(path: Path, data: bytes) -> None:
    """``data`` in a new file only this user may read (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(run_dir: Path) -> list[str]:
    """Remove the key files and folders of ``run_dir`` whose process no longer runs; their
    names. Others' files (names not ours) are left alone."""
    removed: list[str] = []
    try:
        entries = list(run_dir.iterdir())
    except FileNotFoundError:
        return removed
    for path in sorted(entries):
        match = _OWNED.fullmatch(path.name)
        if match is None or running(int(match.group(1) or match.group(2))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path.name)
    if removed:
        log.warning("removed %s from %s: left by processes that no longer run (killed before "
                    "they could remove them)", ", ".join(removed), run_dir)
    return removed
