"""A hold's systemd slice, ``bcd-alloc-alloc_<id>.slice``: prepared on bind, stopped once empty.

The workload manager puts workloads in the slice (``--cgroup-parent``); bcd only
creates it and, after a release, stops it when nothing runs in it any more.
Stopping a slice stops everything in it, so bcd never stops a populated slice: a
release never kills a running workload (stop it first).

With systemd (``systemctl`` on PATH, ``/run/systemd/system`` present, BCD_ROOT
unset) bcd runs ``systemctl start|stop`` on the slice; a slice needs no unit file.
Elsewhere (containers, tests, BCD_ROOT set) preparing is a recorded no-op. Either
way a small record under ``run/bcd/slices/`` remembers the slice until it is
stopped, so a stop deferred by a busy slice is retried (:meth:`Slices.sweep`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .cdi import check_allocation_id
from .files import write_atomic
from .paths import Paths

CommandRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]
Mode = Literal["systemd", "noop"]
State = Literal["prepared", "stopped", "busy", "unknown"]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)


def slice_name(allocation_id: str) -> str:
    """``bcd-alloc-alloc_<id>.slice``: in ``bcd-alloc.slice`` in ``bcd.slice`` (a dash is a level)."""
    return f"bcd-alloc-{check_allocation_id(allocation_id)}.slice"


def slice_cgroup(name: str) -> str:
    """The slice's cgroup path below the hierarchy's root, e.g. ``bcd.slice/bcd-alloc.slice/…``."""
    stem = name.removesuffix(".slice")
    parts = stem.split("-")
    return "/".join("-".join(parts[: level + 1]) + ".slice" for level in range(len(parts)))


class SliceError(Exception):
    """systemctl refused to start the slice; the message carries its answer."""


@dataclass(frozen=True)
class SliceOutcome:
    slice: str
    mode: Mode
    state: State
    message: str = ""


class Slices:
    """Prepares and stops hold slices; ``runner`` runs systemctl (injected in tests)."""

    def __init__(self, paths: Paths, *, systemd: bool, runner: CommandRunner = run_command) -> None:
        self.paths = paths
        self.mode: Mode = "systemd" if systemd else "noop"
        self._runner = runner

    @classmethod
    def detect(cls, paths: Paths, runner: CommandRunner = run_command) -> Slices:
        systemd = (
            paths.root == Path("/")
            and shutil.which("systemctl") is not None
            and Path("/run/systemd/system").is_dir()
        )
        return cls(paths, systemd=systemd, runner=runner)

    @property
    def records(self) -> Path:
        return self.paths.run / "slices"

    def _record(self, allocation_id: str) -> Path:
        return self.records / f"{check_allocation_id(allocation_id)}.json"

    def prepare(self, allocation_id: str) -> SliceOutcome:
        """Create the slice (systemd) or record the no-op; idempotent. Raises SliceError."""
        name = slice_name(allocation_id)
        if self.mode == "systemd":
            done = self._runner(["systemctl", "start", name])
            if done.returncode != 0:
                raise SliceError(
                    f"systemctl start {name} failed ({done.returncode}): "
                    f"{(done.stderr or done.stdout).strip() or 'no output'}"
                )
        record = json.dumps({"slice": name, "mode": self.mode}) + "\n"
        write_atomic(self._record(allocation_id), record, mode=0o644)
        message = "" if self.mode == "systemd" else "no systemd here: the slice is not created"
        return SliceOutcome(name, self.mode, "prepared", message)

    def populated(self, allocation_id: str) -> bool | None:
        """Whether anything runs in the slice's cgroup; None when this cannot be told."""
        relative = slice_cgroup(slice_name(allocation_id))
        root = self.paths.sys / "fs" / "cgroup"
        for unified in (root, root / "unified"):  # cgroup v2, then hybrid's v2 mount
            if (unified / "cgroup.controllers").is_file() or (unified / "cgroup.procs").is_file():
                return _events_populated(unified / relative)
        v1 = root / "systemd"
        if v1.is_dir():
            return _v1_populated(v1 / relative)
        return None if self.mode == "systemd" else False

    def stop_if_empty(self, allocation_id: str) -> SliceOutcome:
        """Stop the slice when nothing runs in it; otherwise leave it (state busy/unknown)."""
        name = slice_name(allocation_id)
        populated = self.populated(allocation_id)
        if populated:
            return SliceOutcome(name, self.mode, "busy",
                                f"{name} still runs workloads: stop them, bcd stops it after")
        if populated is None:
            return SliceOutcome(name, self.mode, "unknown",
                                f"cannot tell whether {name} is empty (no cgroup v2 "
                                "cgroup.events); left running")
        if self.mode == "systemd":
            done = self._runner(["systemctl", "stop", name])
            if done.returncode != 0:
                return SliceOutcome(name, self.mode, "unknown",
                                    f"systemctl stop {name} failed ({done.returncode}): "
                                    f"{(done.stderr or done.stdout).strip() or 'no output'}")
        with contextlib.suppress(FileNotFoundError):
            self._record(allocation_id).unlink()
        return SliceOutcome(name, self.mode, "stopped")

    def recorded(self) -> list[str]:
        """Allocation ids whose slice was prepared and not stopped yet."""
        if not self.records.is_dir():
            return []
        return sorted(path.stem for path in self.records.glob("alloc_*.json"))

    def sweep(self, keep: Collection[str]) -> list[SliceOutcome]:
        """Try to stop every recorded slice whose allocation is not in ``keep``."""
        return [self.stop_if_empty(a) for a in self.recorded() if a not in keep]


def _events_populated(cgroup: Path) -> bool | None:
    if not cgroup.is_dir():
        return False  # never created, or already gone: nothing runs in it
    try:
        text = (cgroup / "cgroup.events").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "populated":
            return value.strip() != "0"
    return None


def _v1_populated(cgroup: Path) -> bool | None:
    if not cgroup.is_dir():
        return False
    try:
        return any(procs.read_text().strip() for procs in cgroup.rglob("cgroup.procs"))
    except OSError:
        return None
