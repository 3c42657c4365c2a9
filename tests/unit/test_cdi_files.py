"""Hold spec files: atomic writes, one GPU per file, re-derived when the vendor spec changes."""

from __future__ import annotations

import json
from pathlib import Path

from better_compute.agent import cdi
from tests.cdi_support import (
    check_cdi_spec,
    install_vendor_spec,
    node_root,
    read_json,
    vendor_document,
)

ALLOC_A = "alloc_aaaaaaaaaaaaaaaaaaaaaaaaaa"
ALLOC_B = "alloc_bbbbbbbbbbbbbbbbbbbbbbbbbb"


def test_a_hold_spec_is_written_atomically_and_only_when_it_changes(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    spec = cdi.derive_hold_spec([inventory.gpus[0].uuid], inventory, None)

    assert cdi.write_hold_spec(paths, ALLOC_A, spec) is True
    target = paths.cdi / f"bcd-{ALLOC_A}.json"
    first = target.stat()
    assert cdi.write_hold_spec(paths, ALLOC_A, spec) is False  # same bytes: left alone

    assert read_json(target) == spec
    assert target.stat().st_ino == first.st_ino and target.stat().st_mtime_ns == first.st_mtime_ns
    assert oct(first.st_mode & 0o777) == "0o644"
    assert sorted(p.name for p in paths.cdi.iterdir()) == [target.name]  # no temp file left


def test_read_holds_lists_every_bcd_spec_and_nothing_else(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    gpus = [g.uuid for g in inventory.gpus]
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec(gpus[:2], inventory, None))
    cdi.write_hold_spec(paths, ALLOC_B, cdi.derive_hold_spec(gpus[5:6], inventory, None))
    (paths.cdi / "bcd-alloc_broken.json").write_text("{")
    (paths.cdi / "other-vendor.json").write_text("{}")

    assert cdi.read_holds(paths) == {
        ALLOC_A: gpus[:2], ALLOC_B: gpus[5:6], "alloc_broken": [],
    }


def test_remove_is_idempotent(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec([inventory.gpus[0].uuid], inventory,
                                                             None))

    assert cdi.remove_hold_spec(paths, ALLOC_A) is True
    assert cdi.remove_hold_spec(paths, ALLOC_A) is False
    assert cdi.read_holds(paths) == {}


def test_a_vendor_spec_change_re_derives_every_hold(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    gpus = [g.uuid for g in inventory.gpus]
    vendor = cdi.read_vendor_spec(paths)
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec(gpus[:2], inventory, vendor))
    cdi.write_hold_spec(paths, ALLOC_B, cdi.derive_hold_spec(gpus[4:5], inventory, vendor))
    watch = cdi.VendorWatch(paths)
    assert watch.changed() is False
    assert cdi.refresh_all(paths, inventory).unchanged == [ALLOC_A, ALLOC_B]

    upgraded = json.loads(
        json.dumps(vendor_document()).replace("570.133.20", "575.51.03")
    )  # a driver upgrade: new library names everywhere
    install_vendor_spec(paths, document=upgraded)
    assert watch.changed() is True
    assert watch.changed() is False  # it remembers what it saw

    result = cdi.refresh_all(paths, inventory)

    assert result.rewritten == [ALLOC_A, ALLOC_B] and not result.kept
    for allocation_id, held in ((ALLOC_A, gpus[:2]), (ALLOC_B, gpus[4:5])):
        spec = read_json(paths.cdi / f"bcd-{allocation_id}.json")
        check_cdi_spec(spec)
        assert cdi.spec_gpus(spec) == held
        text = json.dumps(spec)
        assert "575.51.03" in text and "570.133.20" not in text


def test_removing_the_vendor_spec_re_derives_to_visible_devices_only(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    vendor_file = install_vendor_spec(paths)
    held = [inventory.gpus[3].uuid]
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec(held, inventory,
                                                             cdi.read_vendor_spec(paths)))
    vendor_file.unlink()

    assert cdi.refresh_all(paths, inventory).rewritten == [ALLOC_A]

    spec = read_json(paths.cdi / f"bcd-{ALLOC_A}.json")
    check_cdi_spec(spec)
    assert spec["devices"] == [{"name": held[0], "containerEdits": {
        "env": [f"NVIDIA_VISIBLE_DEVICES={held[0]}"]}}]


def test_a_hold_the_new_vendor_spec_cannot_describe_is_kept_as_it_was(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    install_vendor_spec(paths)
    held = [inventory.gpus[7].uuid]
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec(held, inventory,
                                                             cdi.read_vendor_spec(paths)))
    before = (paths.cdi / f"bcd-{ALLOC_A}.json").read_bytes()
    document = vendor_document()
    document["devices"] = [d for d in document["devices"] if d["name"] != held[0]]
    install_vendor_spec(paths, document=document)

    result = cdi.refresh_all(paths, inventory)

    assert list(result.kept) == [ALLOC_A] and held[0] in result.kept[ALLOC_A]
    assert (paths.cdi / f"bcd-{ALLOC_A}.json").read_bytes() == before  # never dropped


def test_a_broken_vendor_spec_keeps_every_hold(tmp_path: Path) -> None:
    paths, inventory = node_root(tmp_path)
    vendor_file = install_vendor_spec(paths)
    cdi.write_hold_spec(paths, ALLOC_A, cdi.derive_hold_spec(
        [inventory.gpus[0].uuid], inventory, cdi.read_vendor_spec(paths)))
    vendor_file.write_text("{half a file")

    result = cdi.refresh_all(paths, inventory)

    assert list(result.kept) == [ALLOC_A] and "not valid JSON" in result.kept[ALLOC_A]
    assert cdi.spec_gpus(read_json(paths.cdi / f"bcd-{ALLOC_A}.json")) == [inventory.gpus[0].uuid]
