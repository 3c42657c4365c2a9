"""bind(): an assignment from the desired state becomes a hold, or a failure with a reason."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from better_compute.agent import binding, cdi, envfile
from better_compute.agent.gpu import Inventory
from better_compute.agent.paths import Paths
from better_compute.agent.slices import Slices
from tests.cdi_support import check_cdi_spec, install_vendor_spec, node_root, read_json

ALLOC_A = "alloc_aaaaaaaaaaaaaaaaaaaaaaaaaa"
ALLOC_B = "alloc_bbbbbbbbbbbbbbbbbbbbbbbbbb"
RSV = "rsv_rrrrrrrrrrrrrrrrrrrrrrrrrr"


def _assignment(allocation_id: str, gpus: Sequence[str], **extra: Any) -> dict[str, Any]:
    return {"allocationId": allocation_id, "reservationId": RSV, "gpus": list(gpus), **extra}


def _slices(paths: Paths) -> Slices:
    return Slices(paths, systemd=False)


def _bind(paths: Paths, inventory: Inventory, allocation_id: str, gpus: Sequence[str],
          **kwargs: Any) -> binding.BindResult:
    return binding.bind(_assignment(allocation_id, gpus), inventory, paths,
                        slices=_slices(paths), **kwargs)


@pytest.mark.parametrize("with_vendor", [False, True], ids=["no-vendor-spec", "vendor-spec"])
def test_a_bound_hold_writes_the_spec_the_env_file_and_reports_them(
    tmp_path: Path, with_vendor: bool
) -> None:
    paths, inventory = node_root(tmp_path)
    if with_vendor:
        install_vendor_spec(paths)
    held = [g.uuid for g in inventory.gpus[:4]]

    result = binding.bind(_assignment(ALLOC_A, held, cpus=112, memoryGiB=1000,
                                      futureField="ignored"),
                          inventory, paths, slices=_slices(paths))

    assert result.bound, result.message
    spec_file = paths.root / f"etc/cdi/bcd-{ALLOC_A}.json"
    env_file = paths.root / f"run/bcd/allocations/{ALLOC_A}.env"
    assert result.journal_entry() == {
        "kind": "allocation.bound",
        "allocationId": ALLOC_A,
        "gpus": held,
        "cdiDevices": [f"bcd.dev/gpu={uuid}" for uuid in held],
        "envFile": str(env_file),
        "cgroupParent": f"bcd-alloc-{ALLOC_A}.slice",
        "cdiSpec": str(spec_file),
    }
    spec = read_json(spec_file)
    check_cdi_spec(spec)
    assert cdi.spec_gpus(spec) == held  # the spec lists exactly the held GPUs
    assert result.cdi_version == spec["cdiVersion"] == ("0.5.0" if with_vendor else "0.3.0")
    values = envfile.read_env_file(env_file)
    assert values["BCD_CGROUP_PARENT"] == f"bcd-alloc-{ALLOC_A}.slice"
    assert values["NVIDIA_VISIBLE_DEVICES"] == ",".join(held)
    assert values["BCD_RESERVATION_ID"] == RSV and values["BCD_CPUS"] == "112"
    assert result.slice_mode == "noop" and _slices(paths).recorded() == [ALLOC_A]


def test_binding_the_same_assignment_twice_writes_the_same_files(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    held = [inventory.gpus[6].uuid]
    first = _bind(paths, inventory, ALLOC_A, held)
    files = [Path(first.cdi_spec or ""), Path(first.env_file or "")]
    before = [(f.read_bytes(), f.stat().st_mtime_ns) for f in files]

    second = _bind(paths, inventory, ALLOC_A, held)

    assert second.bound and second.journal_entry() == first.journal_entry()
    assert [(f.read_bytes(), f.stat().st_mtime_ns) for f in files] == before


def test_a_gpu_that_is_not_on_the_node_fails_as_device_missing(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    ghost = "GPU-00000000-0000-0000-0000-000000000000"

    result = _bind(paths, inventory, ALLOC_A, [inventory.gpus[0].uuid, ghost])

    assert not result.bound
    assert result.journal_entry() == {
        "kind": "allocation.failed", "allocationId": ALLOC_A, "reason": "device-missing",
        "message": result.message,
    }
    assert ghost in result.message and "not on this node" in result.message
    assert cdi.read_holds(paths) == {} and not (paths.allocations / f"{ALLOC_A}.env").exists()


def test_a_gpu_the_vendor_spec_lacks_fails_as_device_missing(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths, document={"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
                                         "devices": []})

    result = _bind(paths, inventory, ALLOC_A, [inventory.gpus[0].uuid])

    assert (result.outcome, result.reason) == ("failed", "device-missing")
    assert "nvidia-ctk cdi generate" in result.message
    assert cdi.read_holds(paths) == {}


@pytest.mark.parametrize("live", [None, {ALLOC_A, ALLOC_B}], ids=["live-unknown", "both-live"])
def test_a_gpu_in_another_live_hold_fails_as_overlap_and_changes_nothing(
    tmp_path: Path, live: set[str] | None
) -> None:
    paths, inventory = node_root(tmp_path)
    gpus = [g.uuid for g in inventory.gpus]
    assert _bind(paths, inventory, ALLOC_A, gpus[:2]).bound
    spec_a = (paths.cdi / f"bcd-{ALLOC_A}.json").read_bytes()

    result = _bind(paths, inventory, ALLOC_B, gpus[1:3], live=live)

    assert (result.outcome, result.reason) == ("failed", "overlap")
    assert gpus[1] in result.message and ALLOC_A in result.message
    assert cdi.read_holds(paths) == {ALLOC_A: gpus[:2]}
    assert (paths.cdi / f"bcd-{ALLOC_A}.json").read_bytes() == spec_a


def test_a_stale_spec_of_the_same_gpu_is_removed_before_the_new_one_is_written(
    tmp_path: Path,
) -> None:
    paths, inventory = node_root(tmp_path)
    gpus = [g.uuid for g in inventory.gpus]
    assert _bind(paths, inventory, ALLOC_A, gpus[:2]).bound  # A's release never reached bcd

    result = _bind(paths, inventory, ALLOC_B, gpus[1:3], live={ALLOC_B})

    assert result.bound and result.removed_stale == [ALLOC_A]
    assert cdi.read_holds(paths) == {ALLOC_B: gpus[1:3]}  # each GPU in one spec at a time


def test_holds_of_different_gpus_live_side_by_side(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    gpus = [g.uuid for g in inventory.gpus]

    assert _bind(paths, inventory, ALLOC_A, gpus[:4]).bound
    assert _bind(paths, inventory, ALLOC_B, gpus[4:]).bound
    assert cdi.read_holds(paths) == {ALLOC_A: gpus[:4], ALLOC_B: gpus[4:]}


def test_cpus_or_memory_beyond_the_host_fail_as_resources_exhausted(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path, cpus=64, memory_gib=512)
    gpus = [g.uuid for g in inventory.gpus]
    first = binding.bind(_assignment(ALLOC_A, gpus[:4], cpus=48, memoryGiB=256), inventory,
                         paths, slices=_slices(paths))
    assert first.bound

    too_many_cpus = binding.bind(_assignment(ALLOC_B, gpus[4:], cpus=32, memoryGiB=64),
                                 inventory, paths, slices=_slices(paths))
    too_much_memory = binding.bind(_assignment(ALLOC_B, gpus[4:], cpus=8, memoryGiB=300),
                                   inventory, paths, slices=_slices(paths))

    assert (too_many_cpus.reason, too_much_memory.reason) == ("resources-exhausted",) * 2
    assert "16 of 64 are left" in too_many_cpus.message
    assert "256 of 512 GiB are left" in too_much_memory.message
    assert list(cdi.read_holds(paths)) == [ALLOC_A]


def test_a_slice_systemd_refuses_fails_the_bind_and_leaves_no_files(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)

    def refuse(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(argv), 1, "", "Unit bcd.slice is masked.")

    result = binding.bind(_assignment(ALLOC_A, [inventory.gpus[0].uuid]), inventory, paths,
                          slices=Slices(paths, systemd=True, runner=refuse))

    assert (result.outcome, result.reason) == ("failed", "resources-exhausted")
    assert "masked" in result.message
    assert cdi.read_holds(paths) == {} and binding.held_allocations(paths) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"allocationId": "alloc_x-y", "reservationId": RSV, "gpus": ["GPU-1"]},
        {"allocationId": ALLOC_A, "reservationId": "rsv_a\nB=1", "gpus": ["GPU-1"]},
        {"allocationId": ALLOC_A, "reservationId": RSV, "gpus": []},
        {"allocationId": ALLOC_A, "reservationId": RSV, "gpus": ["GPU-1", "GPU-1"]},
        {"allocationId": ALLOC_A, "gpus": ["GPU-1"]},
    ],
)
def test_a_malformed_assignment_is_refused_before_anything_is_written(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    paths, inventory = node_root(tmp_path)

    with pytest.raises(binding.InvalidAssignment):
        binding.bind(bad, inventory, paths, slices=_slices(paths))
    assert binding.held_allocations(paths) == []
