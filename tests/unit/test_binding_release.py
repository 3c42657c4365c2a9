"""release(): the spec and env file go, the slice stops once empty, and it can run twice."""

from __future__ import annotations

from pathlib import Path

from better_compute.agent import binding, cdi
from better_compute.agent.slices import Slices, slice_cgroup
from tests.cdi_support import install_vendor_spec, node_root

ALLOC_A = "alloc_aaaaaaaaaaaaaaaaaaaaaaaaaa"
ALLOC_B = "alloc_bbbbbbbbbbbbbbbbbbbbbbbbbb"
RSV = "rsv_rrrrrrrrrrrrrrrrrrrrrrrrrr"


def test_release_removes_the_files_and_reports_released(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    slices = Slices(paths, systemd=False)
    gpus = [g.uuid for g in inventory.gpus]
    for allocation_id, held in ((ALLOC_A, gpus[:2]), (ALLOC_B, gpus[2:4])):
        assignment = {"allocationId": allocation_id, "reservationId": RSV, "gpus": held}
        assert binding.bind(assignment, inventory, paths, slices=slices).bound

    result = binding.release(ALLOC_A, paths, slices=slices)

    assert result.journal_entry() == {"kind": "allocation.released", "allocationId": ALLOC_A}
    assert result.removed_spec and result.removed_env_file
    assert result.slice.state == "stopped"
    assert not (paths.cdi / f"bcd-{ALLOC_A}.json").exists()
    assert not (paths.allocations / f"{ALLOC_A}.env").exists()
    assert binding.held_allocations(paths) == [ALLOC_B]  # the other hold is untouched
    assert (paths.cdi / "nvidia.json").exists()  # and so is NVIDIA's own spec
    assert slices.recorded() == [ALLOC_B]


def test_release_twice_is_fine_and_reports_again(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    slices = Slices(paths, systemd=False)
    assignment = {"allocationId": ALLOC_A, "reservationId": RSV, "gpus": [inventory.gpus[0].uuid]}
    binding.bind(assignment, inventory, paths, slices=slices)
    binding.release(ALLOC_A, paths, slices=slices)

    again = binding.release(ALLOC_A, paths, slices=slices)

    assert (again.removed_spec, again.removed_env_file) == (False, False)
    assert again.journal_entry()["kind"] == "allocation.released"


def test_release_with_a_running_workload_leaves_the_slice_until_it_is_empty(
    tmp_path: Path,
) -> None:
    paths, inventory = node_root(tmp_path)
    slices = Slices(paths, systemd=False)
    assignment = {"allocationId": ALLOC_A, "reservationId": RSV, "gpus": [inventory.gpus[0].uuid]}
    binding.bind(assignment, inventory, paths, slices=slices)
    cgroup_root = paths.root / "sys/fs/cgroup"
    cgroup = cgroup_root / slice_cgroup(f"bcd-alloc-{ALLOC_A}.slice")
    cgroup.mkdir(parents=True)
    (cgroup_root / "cgroup.controllers").write_text("cpu memory\n")
    (cgroup / "cgroup.events").write_text("populated 1\nfrozen 0\n")

    result = binding.release(ALLOC_A, paths, slices=slices)

    assert result.removed_spec and result.slice.state == "busy"
    assert cdi.read_holds(paths) == {}  # the GPUs are no longer exposed
    assert slices.recorded() == [ALLOC_A]
    (cgroup / "cgroup.events").write_text("populated 0\nfrozen 0\n")
    assert [o.state for o in slices.sweep(keep=binding.held_allocations(paths))] == ["stopped"]
