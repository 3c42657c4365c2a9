"""Deriving a hold's CDI spec: exactly the held GPUs, the lowest cdiVersion, a valid file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.agent import cdi
from tests.cdi_support import (
    check_cdi_spec,
    install_vendor_spec,
    minimum_version,
    node_root,
    vendor_document,
)


def _node_paths(spec: dict[str, Any], device: str) -> list[str]:
    for entry in spec["devices"]:
        if entry["name"] == device:
            return [node["path"] for node in entry["containerEdits"].get("deviceNodes", [])]
    raise AssertionError(f"no device {device}")


def test_without_a_vendor_spec_each_device_carries_only_the_visible_devices(
    tmp_path: Path,
) -> None:
    paths, inventory = node_root(tmp_path)
    held = [inventory.gpus[1].uuid, inventory.gpus[6].uuid]

    spec = cdi.derive_hold_spec(held, inventory, cdi.read_vendor_spec(paths))

    check_cdi_spec(spec)
    assert spec["kind"] == "bcd.dev/gpu"
    assert spec["cdiVersion"] == "0.3.0"
    assert [d["name"] for d in spec["devices"]] == held
    visible = f"NVIDIA_VISIBLE_DEVICES={held[0]},{held[1]}"
    assert all(d["containerEdits"] == {"env": [visible]} for d in spec["devices"])
    assert "containerEdits" not in spec


def test_with_the_vendor_spec_each_device_carries_exactly_its_gpus_nodes_and_hooks(
    tmp_path: Path,
) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    gpu2, gpu5 = inventory.gpus[2], inventory.gpus[5]

    spec = cdi.derive_hold_spec([gpu2.uuid, gpu5.uuid], inventory, cdi.read_vendor_spec(paths))

    check_cdi_spec(spec)
    assert spec["cdiVersion"] == "0.5.0"  # the vendor's device nodes carry hostPath
    assert _node_paths(spec, gpu2.uuid) == ["/dev/nvidia2", "/dev/dri/card3", "/dev/dri/renderD130"]
    assert _node_paths(spec, gpu5.uuid) == ["/dev/nvidia5", "/dev/dri/card6", "/dev/dri/renderD133"]
    every_node = [n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert not {"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia7"} & set(every_node)
    links = spec["devices"][0]["containerEdits"]["hooks"][0]["args"]
    assert gpu2.pci_bus_id is not None
    assert f"../card3::/dev/dri/by-path/pci-{gpu2.pci_bus_id.lower()}-card" in links
    vendor = vendor_document()
    assert spec["containerEdits"] == vendor["containerEdits"]  # control nodes, libraries, hooks
    assert not any(d["name"] == "all" for d in spec["devices"])


def test_vendor_devices_named_by_index_are_matched_by_the_gpus_index(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    document = vendor_document()
    for index, device in enumerate(document["devices"][:8]):
        device["name"] = str(index)
    install_vendor_spec(paths, document=document)

    spec = cdi.derive_hold_spec([inventory.gpus[4].uuid], inventory, cdi.read_vendor_spec(paths))

    check_cdi_spec(spec)
    assert spec["devices"][0]["name"] == inventory.gpus[4].uuid  # named by UUID, not "4"
    assert _node_paths(spec, inventory.gpus[4].uuid)[0] == "/dev/nvidia4"


def test_the_yaml_spec_toolkit_writes_in_var_run_cdi_is_read(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    written = install_vendor_spec(paths, fmt="yaml")
    assert written == paths.root / "var/run/cdi/nvidia.yaml"

    vendor = cdi.read_vendor_spec(paths)

    assert vendor is not None and vendor.path == written
    spec = cdi.derive_hold_spec([inventory.gpus[0].uuid], inventory, vendor)
    check_cdi_spec(spec)
    assert _node_paths(spec, inventory.gpus[0].uuid)[0] == "/dev/nvidia0"


def test_fields_cdi_does_not_define_are_not_copied(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    document = vendor_document()
    document["devices"][0]["containerEdits"]["deviceNodes"][0]["futureField"] = 1
    document["devices"][0]["containerEdits"]["somethingNew"] = ["x"]
    document["containerEdits"]["mounts"][0]["propagation"] = "rslave"
    install_vendor_spec(paths, document=document)

    spec = cdi.derive_hold_spec([inventory.gpus[0].uuid], inventory, cdi.read_vendor_spec(paths))

    check_cdi_spec(spec)  # fails on any field CDI does not define
    assert "futureField" not in spec["devices"][0]["containerEdits"]["deviceNodes"][0]


def test_a_gpu_the_vendor_spec_does_not_describe_is_refused_with_the_fix(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    document = vendor_document()
    document["devices"] = [d for d in document["devices"] if d["name"] != inventory.gpus[3].uuid]
    install_vendor_spec(paths, document=document)

    with pytest.raises(cdi.MissingVendorDevice, match="nvidia-ctk cdi generate") as caught:
        cdi.derive_hold_spec([inventory.gpus[3].uuid], inventory, cdi.read_vendor_spec(paths))
    assert caught.value.uuid == inventory.gpus[3].uuid


@pytest.mark.parametrize("content", ["{not json", "[]", '{"kind": "nvidia.com/gpu"}'])
def test_an_unusable_vendor_spec_is_an_error_that_names_the_file(
    tmp_path: Path, content: str
) -> None:
    paths, _ = node_root(tmp_path)
    (paths.cdi / "nvidia.json").write_text(content)

    with pytest.raises(cdi.VendorSpecError, match=r"nvidia\.json"):
        cdi.read_vendor_spec(paths)


_BASE_DEVICE = {"name": "GPU-1", "containerEdits": {"env": ["A=1"]}}


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({}, "0.3.0"),
        ({"containerEdits": {"mounts": [{"hostPath": "/a", "containerPath": "/a",
                                         "type": "bind"}]}}, "0.4.0"),
        ({"containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/x"}]}},
         "0.5.0"),
        ({"devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]}, "0.5.0"),
        ({"annotations": {"a": "b"}}, "0.6.0"),
        ({"devices": [{**_BASE_DEVICE, "annotations": {"a": "b"}}]}, "0.6.0"),
        ({"kind": "bcd.dev/gpu.hold"}, "0.6.0"),  # a dot AFTER the slash: the class
        ({"kind": "bcd.dev/gpu"}, "0.3.0"),  # dots in the vendor part need nothing
        ({"containerEdits": {"additionalGids": [44]}}, "0.7.0"),
        ({"containerEdits": {"intelRdt": {"closID": "x"}}}, "0.7.0"),
        ({"containerEdits": {"netDevices": [{"hostInterfaceName": "eth1", "name": "n"}]}},
         "1.1.0"),
    ],
)
def test_required_version_is_the_lowest_that_supports_the_fields(
    change: dict[str, Any], expected: str
) -> None:
    spec: dict[str, Any] = {"cdiVersion": "", "kind": "bcd.dev/gpu", "devices": [_BASE_DEVICE]}
    spec.update(change)

    assert cdi.required_version(spec) == expected
    assert minimum_version(spec) == expected  # the tests' independent rule table agrees


@settings(max_examples=40, deadline=None)
@given(held=st.sets(st.integers(min_value=0, max_value=7), min_size=1, max_size=8),
       with_vendor=st.booleans())
def test_any_hold_names_exactly_its_gpus_and_validates(
    tmp_path_factory: pytest.TempPathFactory, held: set[int], with_vendor: bool
) -> None:
    paths, inventory = node_root(tmp_path_factory.mktemp("node"))
    if with_vendor:
        install_vendor_spec(paths)
    uuids = [inventory.gpus[i].uuid for i in sorted(held)]

    spec = cdi.derive_hold_spec(uuids, inventory, cdi.read_vendor_spec(paths))

    check_cdi_spec(spec)
    assert cdi.spec_gpus(spec) == uuids
    if with_vendor:
        nodes = {n["path"] for d in spec["devices"] for n in d["containerEdits"]["deviceNodes"]}
        gpu_nodes = {p for p in nodes if p.startswith("/dev/nvidia") and p[11:].isdigit()}
        assert gpu_nodes == {f"/dev/nvidia{i}" for i in held}


def test_device_names_follow_cdi_rules() -> None:
    assert cdi.device_name("GPU-5302eeb2-4148") == "bcd.dev/gpu=GPU-5302eeb2-4148"
    assert cdi.is_valid_device_name("GPU-5302eeb2-4148-5646-8205-2dd06c5e17e7")
    assert not cdi.is_valid_device_name("GPU-x/../y")
    assert not cdi.is_valid_device_name("-GPU")


@pytest.mark.parametrize("bad", ["alloc-x", "alloc_../x", "rsv_abc", "alloc_", "alloc_a-b"])
def test_allocation_ids_that_would_escape_the_folder_or_nest_the_slice_are_refused(
    bad: str,
) -> None:
    with pytest.raises(ValueError, match="not an allocation id"):
        cdi.check_allocation_id(bad)
