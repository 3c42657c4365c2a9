"""The container-toolkit unit inside the real `bcd node`, driven by the in-test gateway.

The ``profile`` section (a pool's nodeProfile) has bcd generate etc/cdi/nvidia.json before
it binds the ``devices`` of the same desired state, and again when the driver changes (not
when only a GPU's health does). Without nvidia-ctk the section fails with a clear message,
reported to the gateway, and nothing is written; the hold binds all the same.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from anyio.abc import Process

from better_compute.agent.gpu import load_fake_file, set_fake_gpu_health
from better_compute.api import pki
from tests.bcd_fake_gateway import FakeGateway, make_node_root
from tests.cdi_support import VENDOR_H100X8, fake_nvidia_ctk
from tests.support import BCD

pytestmark = pytest.mark.anyio
ALLOC = "alloc_tk000000000000000000000001"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _section(gateway: FakeGateway, name: str) -> dict[str, Any]:
    report = gateway.last_report
    section = report.sections.get(name) if report is not None else None
    return msgspec.to_builtins(section) if section is not None else {}


async def _run_node(tmp_path: Path, with_ctk: bool, check: Any) -> None:
    """bcd node with a profile naming the toolkit and one hold; then ``check(...)``."""
    bundle = pki.generate_bundle()
    (tmp_path / "gw").mkdir()
    async with anyio.create_task_group() as group:
        gateway = FakeGateway(bundle, None, tmp_path / "gw")  # type: ignore[arg-type]
        port = await group.start(gateway.serve)
        root = make_node_root(tmp_path / "n", bundle, f"https://127.0.0.1:{port}")
        gateway.node_key = root.key.public_key()
        gpus = [gpu.uuid for gpu in load_fake_file(root.gpu_file).gpus]
        gateway.sections = {
            "profile": {"units": ["container-toolkit"]},
            "devices": {"assignments": [{"allocationId": ALLOC, "reservationId": "rsv_tk1",
                                         "gpus": gpus[:2], "cpus": 8, "memoryGiB": 64}]}}
        log = fake_nvidia_ctk(tmp_path / "bin") if with_ctk else tmp_path / "no.log"
        path = f"{tmp_path / 'bin'}:/usr/bin:/bin" if with_ctk else "/usr/bin:/bin"
        env = {**root.env, "PATH": path, "HOME": str(tmp_path)}
        process: Process = await anyio.open_process([BCD, "node"], env=env)
        try:
            await gateway.wait_for(lambda: _section(gateway, "devices").get("state") == "applied")
            await check(gateway, root, log)
        finally:
            process.kill()
            await process.wait()
            await process.aclose()
        gateway.stop()


async def test_nvidia_json_before_the_hold_and_again_after_a_driver_upgrade(tmp_path: Path
                                                                           ) -> None:
    async def check(gateway: FakeGateway, root: Any, log: Path) -> None:
        cdi = root.paths.cdi
        assert (cdi / "nvidia.json").read_bytes() == VENDOR_H100X8.read_bytes()
        profile = _section(gateway, "profile")
        assert profile["state"] == "applied" and "generated" in profile["message"]
        hold = json.loads((cdi / f"bcd-{ALLOC}.json").read_text())
        assert [d["containerEdits"]["deviceNodes"][0]["path"] for d in hold["devices"]] == \
            ["/dev/nvidia0", "/dev/nvidia1"]
        assert len(log.read_text().splitlines()) == 1

        set_fake_gpu_health(root.gpu_file, 3, healthy=False, reasons=["xid-79"])
        await gateway.wait_for(lambda: gateway.report.inventory is not None and any(
            not g.healthy for g in gateway.report.inventory.gpus))
        assert len(log.read_text().splitlines()) == 1  # health is not the GPU set

        document = json.loads(root.gpu_file.read_text())
        document["driverVersion"] = "575.51.03"
        root.gpu_file.write_text(json.dumps(document))
        await gateway.wait_for(lambda: "driver 575.51.03" in _section(gateway, "profile")
                               .get("message", ""))
        assert len(log.read_text().splitlines()) == 2

    await _run_node(tmp_path, True, check)


async def test_without_nvidia_ctk_the_profile_fails_clearly_and_nothing_is_written(
        tmp_path: Path) -> None:
    async def check(gateway: FakeGateway, root: Any, log: Path) -> None:
        profile = _section(gateway, "profile")
        assert profile["state"] == "failed"
        assert "nvidia-ctk is not on PATH" in profile["message"]
        assert "install the NVIDIA container toolkit" in profile["message"]
        # The hold is bound all the same, with NVIDIA_VISIBLE_DEVICES only.
        assert sorted(p.name for p in root.paths.cdi.iterdir()) == [f"bcd-{ALLOC}.json"]
        hold = json.loads((root.paths.cdi / f"bcd-{ALLOC}.json").read_text())
        assert list(hold["devices"][0]["containerEdits"]) == ["env"]
        assert not os.path.exists(log)

    await _run_node(tmp_path, False, check)
