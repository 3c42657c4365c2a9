"""agent/gpu/fake.py: the GPU source described by a JSON file."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from better_compute.agent.gpu import (
    FakeSource,
    GpuSource,
    GpuSourceError,
    Inventory,
    set_fake_gpu_health,
    write_fake_fleet_file,
)

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _write(path: Path, document: Any) -> Path:
    path.write_text(json.dumps(document))
    return path


def test_fleet_file_describes_an_hgx_h100_host(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    written = write_fake_fleet_file(path)
    inventory = FakeSource(path).inventory()

    assert inventory == written
    assert inventory.source == "fake"
    assert inventory.host.serial == "SN-7701"
    assert inventory.host.product_uuid and inventory.host.macs and inventory.host.cpus == 224
    assert [gpu.index for gpu in inventory.gpus] == list(range(8))
    assert all(GPU_UUID.match(gpu.uuid) for gpu in inventory.gpus)
    assert len({gpu.uuid for gpu in inventory.gpus}) == 8
    assert len({gpu.serial for gpu in inventory.gpus}) == 8
    assert inventory.gpus[0].pci_bus_id == "0000:18:00.0"
    assert len({gpu.pci_bus_id for gpu in inventory.gpus}) == 8
    assert {gpu.memory_mib for gpu in inventory.gpus} == {81559}
    assert {gpu.family for gpu in inventory.gpus} == {"H100"}
    assert {gpu.name for gpu in inventory.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert all(gpu.healthy and not gpu.health_reasons for gpu in inventory.gpus)
    domains = {gpu.nvlink_domain for gpu in inventory.gpus}
    assert len(domains) == 1 and None not in domains


def test_fleet_identities_follow_the_host_serial(tmp_path: Path) -> None:
    first = write_fake_fleet_file(tmp_path / "a.json", serial="SN-1")
    again = write_fake_fleet_file(tmp_path / "b.json", serial="SN-1")
    other = write_fake_fleet_file(tmp_path / "c.json", serial="SN-2", gpus=4, model="NVIDIA L40S")

    assert [g.uuid for g in first.gpus] == [g.uuid for g in again.gpus]
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}
    assert first.host.product_uuid != other.host.product_uuid
    assert first.gpus[0].nvlink_domain != other.gpus[0].nvlink_domain
    assert len(other.gpus) == 4 and {g.family for g in other.gpus} == {"L40S"}


def test_fake_source_satisfies_the_protocol(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    write_fake_fleet_file(path)
    source = FakeSource(path)
    assert isinstance(source, GpuSource)
    assert source.name == "fake"


def test_editing_the_file_changes_the_next_inventory(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    written = write_fake_fleet_file(path)
    source = FakeSource(path)
    assert source.inventory().gpus[3].healthy

    set_fake_gpu_health(path, 3, healthy=False, reasons=["xid-79"])
    after = source.inventory()
    assert (after.gpus[3].healthy, after.gpus[3].health_reasons) == (False, ["xid-79"])
    assert [gpu.healthy for gpu in after.gpus].count(False) == 1

    set_fake_gpu_health(path, written.gpus[3].uuid, healthy=True)
    assert source.inventory().gpus[3].healthy

    document = json.loads(path.read_text())
    del document["gpus"][7]
    document["gpus"][0]["temperatureC"] = 77
    _write(path, document)
    edited = source.inventory()
    assert len(edited.gpus) == 7
    assert edited.gpus[0].temperature_c == 77


def test_unknown_gpu_in_health_edit_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    write_fake_fleet_file(path, gpus=2)
    with pytest.raises(GpuSourceError, match="no GPU 5"):
        set_fake_gpu_health(path, 5, healthy=False)


def test_minimal_file_gets_positions_and_defaults(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "gpus.json",
        {
            "host": {"serial": "S1", "productUuid": "u-1", "macs": ["aa:bb"], "memoryGiB": 512},
            "gpus": [
                {"uuid": "GPU-a", "name": "NVIDIA H200", "pciBusId": "00000000:1B:00.0"},
                {"uuid": "GPU-b", "name": "NVIDIA H200", "healthy": False, "memoryMiB": 143771},
            ],
        },
    )
    inventory = FakeSource(path).inventory()
    assert [(g.index, g.uuid) for g in inventory.gpus] == [(0, "GPU-a"), (1, "GPU-b")]
    assert inventory.host.memory_gib == 512.0
    assert inventory.host.cpus is None
    assert inventory.gpus[0].pci_bus_id == "0000:1b:00.0"
    assert inventory.gpus[0].family == "H200"
    assert inventory.gpus[1].memory_mib == 143771
    assert inventory.gpus[1].healthy is False
    assert inventory.gpus[0].utilization_pct is None


def test_explicit_indexes_order_the_report(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "gpus.json",
        {
            "gpus": [
                {"index": 1, "uuid": "GPU-b", "name": "x"},
                {"index": 0, "uuid": "GPU-a", "name": "x"},
            ]
        },
    )
    assert [g.uuid for g in FakeSource(path).inventory().gpus] == ["GPU-a", "GPU-b"]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            {
                "gpus": [
                    {"uuid": "a", "name": "x"},
                    {"uuid": "b", "name": "x"},
                    {"uuid": "c", "name": "x", "memoryMiB": "lots"},
                ]
            },
            "$.gpus[2].memoryMiB",
        ),
        ({"gpus": [{"name": "x"}]}, "uuid"),
        ({"host": {"cpus": "many"}, "gpus": []}, "$.host.cpus"),
        ({"gpus": [{"uuid": "a", "name": "x", "healty": False}]}, "'healty' at `$.gpus[0]`"),
        ({"host": {"serail": "x"}, "gpus": []}, "'serail' at `$.host`"),
        ({"gpu": []}, "'gpu' at `$`"),
        ({"gpus": {"uuid": "a"}}, "$.gpus"),
        ([1, 2], "`$`"),
        ({"gpus": [{"uuid": "a", "name": "x"}, {"uuid": "a", "name": "y"}]}, "duplicate uuid 'a'"),
        ({"gpus": [{"uuid": "a", "name": "x", "index": -1}]}, "$.gpus[0].index"),
    ],
)
def test_malformed_file_names_the_file_and_field(
    tmp_path: Path, document: Any, expected: str
) -> None:
    path = _write(tmp_path / "bad.json", document)
    with pytest.raises(GpuSourceError) as caught:
        FakeSource(path)
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_a_file_broken_while_running_fails_that_read_only(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    write_fake_fleet_file(path, gpus=2)
    source = FakeSource(path)
    path.write_text('{"gpus": [')
    with pytest.raises(GpuSourceError, match="not valid JSON"):
        source.inventory()
    write_fake_fleet_file(path, gpus=2)
    assert len(source.inventory().gpus) == 2


def test_missing_file_says_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(GpuSourceError, match=r"does not exist.*BCD_GPU_SOURCE=fake:FILE"):
        FakeSource(tmp_path / "absent.json")


def test_inventory_round_trips_on_the_wire_and_tolerates_new_fields(tmp_path: Path) -> None:
    inventory = write_fake_fleet_file(tmp_path / "gpus.json", gpus=2)
    wire = json.loads(msgspec.json.encode(inventory))
    assert {"productUuid", "memoryGiB"} <= set(wire["host"])
    assert {"pciBusId", "memoryMiB", "nvlinkDomain", "healthReasons"} <= set(wire["gpus"][0])
    assert wire["driverVersion"] == inventory.driver_version

    wire["fromTheFuture"] = 1
    wire["gpus"][0]["fromTheFuture"] = {"x": 1}
    assert msgspec.json.decode(json.dumps(wire), type=Inventory) == inventory
