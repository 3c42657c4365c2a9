"""The container-toolkit unit: etc/cdi/nvidia.json from nvidia-ctk, all or nothing.

nvidia-ctk is a stand-in at the hardware edge (tests/cdi_support.py ``fake_nvidia_ctk``:
a shell script printing the spec nvidia-ctk gives the simulated H100 server), run as a
real process from PATH, like the real one. The unit functions are called directly here;
tests/integration/test_bcd_toolkit_process.py runs them inside `bcd node`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from better_compute.agent import cdi
from better_compute.agent.gpu import Inventory
from better_compute.agent.paths import Paths
from better_compute.agent.toolkit import apply_profile, generate_vendor_spec
from better_compute.api.wire.sections import ProfileSection
from tests.cdi_support import VENDOR_H100X8, fake_nvidia_ctk, node_root

ALLOC = "alloc_aaaaaaaaaaaaaaaaaaaaaaaaaa"
PROFILE = ProfileSection(units=["container-toolkit"])


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    """A folder first on PATH for this test (where a fake nvidia-ctk may be put)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    saved = os.environ["PATH"]
    os.environ["PATH"] = f"{folder}:/usr/bin:/bin"
    yield folder
    os.environ["PATH"] = saved


def cdi_files(paths: Paths) -> list[str]:
    return sorted(p.name for p in paths.cdi.iterdir())


def test_it_writes_what_nvidia_ctk_prints_and_holds_pick_it_up(tmp_path: Path, on_path: Path
                                                                ) -> None:
    paths, inventory = node_root(tmp_path)
    hold = cdi.derive_hold_spec([inventory.gpus[0].uuid], inventory, None)
    cdi.write_hold_spec(paths, ALLOC, hold)  # bound before the vendor spec existed
    log = fake_nvidia_ctk(on_path)
    done = apply_profile(PROFILE, paths, inventory, None, None, None)
    assert done.state == "applied" and "generated" in done.message
    assert "1 hold spec(s) rewritten" in done.message
    assert (paths.cdi / "nvidia.json").read_bytes() == VENDOR_H100X8.read_bytes()
    assert oct((paths.cdi / "nvidia.json").stat().st_mode & 0o777) == "0o644"
    spec = json.loads(cdi.spec_path(paths, ALLOC).read_text())
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
    assert cdi_files(paths) == [f"bcd-{ALLOC}.json", "nvidia.json"]

    again = apply_profile(PROFILE, paths, inventory, None, None, done.fingerprint)
    assert again.state == "applied" and "is current" in again.message
    assert len(log.read_text().splitlines()) == 1  # nothing changed: nvidia-ctk not run


def test_it_runs_again_when_the_driver_or_the_gpu_set_changes(tmp_path: Path, on_path: Path
                                                               ) -> None:
    paths, inventory = node_root(tmp_path)
    log = fake_nvidia_ctk(on_path)
    first = generate_vendor_spec(paths, inventory, None, None, None)
    upgraded = Inventory(host=inventory.host, gpus=inventory.gpus, source=inventory.source,
                         driver_version="575.51.03")
    second = generate_vendor_spec(paths, upgraded, None, None, first.fingerprint)
    assert second.fingerprint != first.fingerprint and "driver 575.51.03" in second.message
    fewer = Inventory(host=inventory.host, gpus=inventory.gpus[:7], source=inventory.source,
                      driver_version="575.51.03")
    third = generate_vendor_spec(paths, fewer, None, None, second.fingerprint)
    assert third.fingerprint not in (first.fingerprint, second.fingerprint)
    (paths.cdi / "nvidia.json").unlink()  # removed by hand: made again
    generate_vendor_spec(paths, fewer, None, None, third.fingerprint)
    assert len(log.read_text().splitlines()) == 4


def test_without_nvidia_ctk_nothing_is_written_and_the_message_says_what_to_install(
        tmp_path: Path, on_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    done = apply_profile(PROFILE, paths, inventory, None, None, None)
    assert done.state == "failed" and done.fingerprint is None
    assert "nvidia-ctk is not on PATH" in done.message
    assert "install the NVIDIA container toolkit" in done.message
    assert "[container_toolkit] cdi_generate" in done.message
    assert cdi_files(paths) == []


@pytest.mark.parametrize("output,exit_code,needle", [
    (None, 3, "exited with 3"),
    ("not json at all", 0, "its output is not JSON"),
    ('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu"}', 0, "is not a CDI spec"),
    ('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}', 0,
     "describes no device for GPU-"),
])
def test_a_failing_or_wrong_nvidia_ctk_leaves_the_old_spec_as_it_was(
        tmp_path: Path, on_path: Path, output: str | None, exit_code: int, needle: str) -> None:
    paths, inventory = node_root(tmp_path)
    (paths.cdi / "nvidia.json").write_text('{"old": true}')
    printed = tmp_path / "printed.json"
    if output is not None:
        printed.write_text(output)
    fake_nvidia_ctk(on_path, printed if output is not None else VENDOR_H100X8, exit_code)
    done = generate_vendor_spec(paths, inventory, None, None, "an-older-fingerprint")
    assert done.state == "failed" and needle in done.message
    assert "was not changed" in done.message
    assert done.fingerprint == "an-older-fingerprint"  # so it is tried again next time
    assert (paths.cdi / "nvidia.json").read_text() == '{"old": true}'
    assert cdi_files(paths) == ["nvidia.json"]  # no temp file left behind


def test_the_command_comes_from_config_and_unknown_units_are_named(tmp_path: Path,
                                                                   on_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    fake_nvidia_ctk(on_path)
    (on_path / "nvidia-ctk").rename(on_path / "ctk-1.17")
    command = ("ctk-1.17", "cdi", "generate", "--format=json", "--device-name-strategy=uuid")
    done = apply_profile(ProfileSection(units=["container-toolkit", "dcgm"]), paths, inventory, None,
                         command, None)
    assert done.state == "failed"  # dcgm is unknown, the toolkit ran
    assert "generated" in done.message and "with ctk-1.17" in done.message
    assert "dcgm: this bcd does not know the unit; upgrade bcd" in done.message
    assert (paths.cdi / "nvidia.json").exists()


def test_an_unreadable_gpu_source_writes_nothing(tmp_path: Path, on_path: Path) -> None:
    paths, _ = node_root(tmp_path)
    log = fake_nvidia_ctk(on_path)
    done = generate_vendor_spec(paths, None, "NVML: driver not loaded", None, None)
    assert done.state == "failed" and "GPU source cannot be read" in done.message
    assert not log.exists() and cdi_files(paths) == []
