"""A hold's env file: what it sets, that sh reads it as written, atomic write and removal."""

from __future__ import annotations

from pathlib import Path

import pytest

from better_compute.agent import envfile
from better_compute.agent.paths import Paths
from tests.cdi_support import source_env_file

ALLOC = "alloc_mfrggzdfmztwq2lknnwg23tpob"
RSV = "rsv_onxw2zlsmvxgk3tfobzxi33foqx"
GPUS = ["GPU-5302eeb2-4148-5646-8205-2dd06c5e17e7", "GPU-12b4083d-5abd-56c2-a2b6-5a943e3324f5"]


def _values(**extra: float) -> dict[str, str]:
    return envfile.hold_values(allocation_id=ALLOC, reservation_id=RSV, gpus=GPUS, **extra)


def test_the_env_file_names_the_slice_the_gpus_and_the_ids(tmp_path: Path) -> None:
    paths = Paths(tmp_path)

    assert envfile.write_env_file(paths, ALLOC, _values(cpus=56, memory_gib=480.5)) is True

    path = tmp_path / "run/bcd/allocations" / f"{ALLOC}.env"
    assert envfile.env_path(paths, ALLOC) == path
    assert envfile.read_env_file(path) == {
        "BCD_ALLOCATION_ID": ALLOC,
        "BCD_RESERVATION_ID": RSV,
        "BCD_CGROUP_PARENT": f"bcd-alloc-{ALLOC}.slice",
        "NVIDIA_VISIBLE_DEVICES": ",".join(GPUS),
        "BCD_CDI_DEVICES": ",".join(f"bcd.dev/gpu={uuid}" for uuid in GPUS),
        "BCD_GPU_COUNT": "2",
        "BCD_CPUS": "56",
        "BCD_MEMORY_GIB": "480.5",
    }
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_sh_reads_the_file_the_way_the_tutorial_sources_it(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    envfile.write_env_file(paths, ALLOC, _values())

    exported = source_env_file(envfile.env_path(paths, ALLOC),
                               ["BCD_CGROUP_PARENT", "BCD_CDI_DEVICES", "NVIDIA_VISIBLE_DEVICES"])

    assert exported == {
        "BCD_CGROUP_PARENT": f"bcd-alloc-{ALLOC}.slice",
        "BCD_CDI_DEVICES": ",".join(f"bcd.dev/gpu={uuid}" for uuid in GPUS),
        "NVIDIA_VISIBLE_DEVICES": ",".join(GPUS),
    }


def test_writing_the_same_values_again_leaves_the_file_alone(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    envfile.write_env_file(paths, ALLOC, _values())
    before = envfile.env_path(paths, ALLOC).stat()

    assert envfile.write_env_file(paths, ALLOC, _values()) is False
    assert envfile.env_path(paths, ALLOC).stat().st_mtime_ns == before.st_mtime_ns
    assert [p.name for p in (tmp_path / "run/bcd/allocations").iterdir()] == [f"{ALLOC}.env"]


@pytest.mark.parametrize("value", ["two words", "x\nEVIL=1", "$(reboot)", "'quoted'"])
def test_values_that_would_need_quoting_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="need quoting"):
        envfile.render({"BCD_RESERVATION_ID": value})


def test_remove_is_idempotent(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    envfile.write_env_file(paths, ALLOC, _values())

    assert envfile.remove_env_file(paths, ALLOC) is True
    assert envfile.remove_env_file(paths, ALLOC) is False
    assert not envfile.env_path(paths, ALLOC).exists()
