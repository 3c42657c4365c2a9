"""Hold slices: created through systemd when present, a recorded no-op otherwise, and
stopped only once empty, so a release never kills a running workload."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from better_compute.agent.paths import Paths
from better_compute.agent.slices import SliceError, Slices, slice_cgroup, slice_name

ALLOC = "alloc_mfrggzdfmztwq2lknnwg23tpob"
SLICE = f"bcd-alloc-{ALLOC}.slice"


class FakeSystemctl:
    """Records every command; answers with ``returncode`` and ``stderr``."""

    def __init__(self, returncode: int = 0, stderr: str = "") -> None:
        self.calls: list[list[str]] = []
        self.returncode = returncode
        self.stderr = stderr

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(list(argv), self.returncode, "", self.stderr)


def _cgroup_v2(root: Path, populated: int | None) -> Path:
    """A cgroup v2 tree under BCD_ROOT/sys/fs/cgroup; the slice's cgroup when populated is set."""
    base = root / "sys/fs/cgroup"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    cgroup = base / slice_cgroup(SLICE)
    if populated is not None:
        cgroup.mkdir(parents=True)
        (cgroup / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
    return cgroup


def test_slice_names_nest_under_bcd_slice() -> None:
    assert slice_name(ALLOC) == SLICE
    assert slice_cgroup(SLICE) == f"bcd.slice/bcd-alloc.slice/{SLICE}"


def test_without_systemd_preparing_is_a_recorded_no_op(tmp_path: Path) -> None:
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=False, runner=runner)

    outcome = slices.prepare(ALLOC)

    assert (outcome.slice, outcome.mode, outcome.state) == (SLICE, "noop", "prepared")
    assert "not created" in outcome.message
    assert runner.calls == []
    assert slices.recorded() == [ALLOC]


def test_detect_never_uses_systemd_under_a_bcd_root(tmp_path: Path) -> None:
    assert Slices.detect(Paths(tmp_path)).mode == "noop"


def test_with_systemd_the_slice_is_started_by_name(tmp_path: Path) -> None:
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=True, runner=runner)

    outcome = slices.prepare(ALLOC)

    assert outcome.mode == "systemd" and outcome.state == "prepared"
    assert runner.calls == [["systemctl", "start", SLICE]]
    assert slices.recorded() == [ALLOC]


def test_a_slice_systemd_refuses_is_an_error_with_its_answer(tmp_path: Path) -> None:
    slices = Slices(Paths(tmp_path), systemd=True,
                    runner=FakeSystemctl(1, "Failed to start: Access denied"))

    with pytest.raises(SliceError, match="Access denied"):
        slices.prepare(ALLOC)
    assert slices.recorded() == []


def test_a_populated_slice_is_left_running(tmp_path: Path) -> None:
    _cgroup_v2(tmp_path, populated=1)
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=True, runner=runner)
    slices.prepare(ALLOC)

    outcome = slices.stop_if_empty(ALLOC)

    assert outcome.state == "busy" and "stop them" in outcome.message
    assert ["systemctl", "stop", SLICE] not in runner.calls
    assert slices.recorded() == [ALLOC]  # retried by a later sweep


def test_an_empty_slice_is_stopped_and_forgotten(tmp_path: Path) -> None:
    cgroup = _cgroup_v2(tmp_path, populated=1)
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=True, runner=runner)
    slices.prepare(ALLOC)
    assert slices.sweep(keep=set())[0].state == "busy"
    (cgroup / "cgroup.events").write_text("populated 0\nfrozen 0\n")  # the workload exited

    outcomes = slices.sweep(keep=set())

    assert [(o.slice, o.state) for o in outcomes] == [(SLICE, "stopped")]
    assert runner.calls[-1] == ["systemctl", "stop", SLICE]
    assert slices.recorded() == []


def test_sweep_keeps_the_slices_of_live_holds(tmp_path: Path) -> None:
    _cgroup_v2(tmp_path, populated=0)
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=True, runner=runner)
    slices.prepare(ALLOC)

    assert slices.sweep(keep={ALLOC}) == []
    assert runner.calls == [["systemctl", "start", SLICE]]


def test_a_slice_never_created_counts_as_empty(tmp_path: Path) -> None:
    _cgroup_v2(tmp_path, populated=None)
    slices = Slices(Paths(tmp_path), systemd=True, runner=FakeSystemctl())

    assert slices.populated(ALLOC) is False
    assert slices.stop_if_empty(ALLOC).state == "stopped"


def test_when_emptiness_cannot_be_told_systemd_slices_are_left_alone(tmp_path: Path) -> None:
    base = tmp_path / "sys/fs/cgroup"
    cgroup = base / slice_cgroup(SLICE)
    cgroup.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu\n")  # v2, but no cgroup.events in the slice
    runner = FakeSystemctl()
    slices = Slices(Paths(tmp_path), systemd=True, runner=runner)

    outcome = slices.stop_if_empty(ALLOC)

    assert outcome.state == "unknown"
    assert runner.calls == []


def test_cgroup_v1_reads_the_processes_of_the_systemd_hierarchy(tmp_path: Path) -> None:
    cgroup = tmp_path / "sys/fs/cgroup/systemd" / slice_cgroup(SLICE) / "job.scope"
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text("4242\n")
    slices = Slices(Paths(tmp_path), systemd=True, runner=FakeSystemctl())

    assert slices.populated(ALLOC) is True
    (cgroup / "cgroup.procs").write_text("")
    assert slices.populated(ALLOC) is False
