"""A hold's env file: ``BCD_ROOT/run/bcd/allocations/alloc_<id>.env``.

The workload manager on the node reads it to place a workload in the hold::

    set -a; . /run/bcd/allocations/alloc_….env; set +a
    podman run --device bcd.dev/gpu=GPU-… --cgroup-parent "$BCD_CGROUP_PARENT" ...

``BCD_CDI_DEVICES`` lists the hold's CDI names, comma-separated.

One ``KEY=value`` per line, values unquoted and limited to characters that need
no quoting, so the same file works for POSIX ``sh`` (``.``), systemd's
``EnvironmentFile=`` and ``docker --env-file``. Written atomically; removed on
release.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cdi import check_allocation_id, device_name
from .files import write_atomic
from .paths import Paths
from .slices import slice_name

HEADER = "# Written by bcd for one GPU hold; removed when the hold is released. Do not edit.\n"

_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*\Z")
# Characters that mean the same unquoted in sh, systemd EnvironmentFile and docker --env-file.
_VALUE = re.compile(r"^[A-Za-z0-9_.,:/=@+%-]*\Z")


def env_path(paths: Paths, allocation_id: str) -> Path:
    return paths.allocations / f"{check_allocation_id(allocation_id)}.env"


def hold_values(
    *,
    allocation_id: str,
    reservation_id: str,
    gpus: Sequence[str],
    cpus: float | None = None,
    memory_gib: float | None = None,
) -> dict[str, str]:
    """The variables of a hold's env file, in the order they are written."""
    values = {
        "BCD_ALLOCATION_ID": allocation_id,
        "BCD_RESERVATION_ID": reservation_id,
        "BCD_CGROUP_PARENT": slice_name(allocation_id),
        "NVIDIA_VISIBLE_DEVICES": ",".join(gpus),
        "BCD_CDI_DEVICES": ",".join(device_name(uuid) for uuid in gpus),
        "BCD_GPU_COUNT": str(len(gpus)),
    }
    if cpus is not None:
        values["BCD_CPUS"] = _number(cpus)
    if memory_gib is not None:
        values["BCD_MEMORY_GIB"] = _number(memory_gib)
    return values


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(values: Mapping[str, str]) -> str:
    """The file's text; raises ValueError for a key or value that would need quoting."""
    lines = [HEADER]
    for key, value in values.items():
        if not _KEY.match(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        if not _VALUE.match(value):
            raise ValueError(f"the value of {key} ({value!r}) has characters that need quoting")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def write_env_file(paths: Paths, allocation_id: str, values: Mapping[str, str]) -> bool:
    """Write the hold's env file atomically; False (nothing written) when already on disk."""
    path = env_path(paths, allocation_id)
    text = render(values)
    with contextlib.suppress(OSError):
        if path.read_text() == text:
            return False
    write_atomic(path, text, mode=0o644)
    return True


def read_env_file(path: Path) -> dict[str, str]:
    """The variables of an env file bcd wrote (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return values


def remove_env_file(paths: Paths, allocation_id: str) -> bool:
    """Remove the hold's env file; False when there was none (release is idempotent)."""
    try:
        env_path(paths, allocation_id).unlink()
    except FileNotFoundError:
        return False
    return True
