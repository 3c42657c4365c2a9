"""bcd's device plugin beside a test kubelet, over real unix sockets, without a control plane.

What the end-to-end test cannot stage cheaply: a kubelet that is not there yet, one that
refuses Register (bcd retries with backoff and says why), a folder whose socket path is too
long, a plugin turned off and on by the desired state, the list a release waits for, and
the socket removed on the way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from better_compute.agent.kubelet.devices import KubeletDevice
from better_compute.agent.kubelet.plugin import DevicePlugin
from better_compute.agent.node.pulse import Pulse
from tests.kubelet import Kubelet, short_tempdir

pytestmark = pytest.mark.anyio
GPU = "GPU-5302eeb2-4148-5646-8205-2dd06c5e17e7"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def folder() -> Iterator[Path]:
    """A device-plugin folder with a short path (unix socket paths hold 107 bytes)."""
    with short_tempdir() as top:
        yield top / "device-plugins"


def plugin_in(folder: Path, lines: list[str]) -> DevicePlugin:
    return DevicePlugin(folder, say=lines.append, now=lambda: "2031-05-01T12:00:00Z",
                        poll_seconds=0.05)


async def until(check: Any, timeout: float = 60.0) -> None:
    """Await a condition the plugin's own tasks make true (checked as they yield)."""
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


def held(*ids: str, healthy: bool = True) -> list[KubeletDevice]:
    return [KubeletDevice(uuid, healthy, "alloc_a1", "rsv_a1") for uuid in ids]


async def test_it_waits_for_the_kubelet_then_registers_and_lists(folder: Path) -> None:
    lines: list[str] = []
    plugin = plugin_in(folder, lines)
    plugin.publish(held(GPU))
    kubelet = Kubelet(folder)
    async with anyio.create_task_group() as group:
        group.start_soon(plugin.run, "bcd.dev/gpu")
        await until(lambda: "waiting for the kubelet" in plugin.status.reason)
        snapshot = plugin.snapshot()
        assert snapshot["enabled"] and not snapshot["registered"]
        assert snapshot["socket"] == str(folder / "bcd-gpu.sock")
        assert (folder / "bcd-gpu.sock").is_socket()  # served before any kubelet came

        await anyio.to_thread.run_sync(kubelet.start)
        try:
            await anyio.to_thread.run_sync(kubelet.wait_registration, 1)
            await until(lambda: plugin.status.registered)
            assert await anyio.to_thread.run_sync(
                kubelet.wait_list, lambda d: d == {GPU: "Healthy"}, "the held GPU")
            # A health change goes out as a new list, and delivered() sees it sent.
            plugin.publish(held(GPU, healthy=False))
            assert await plugin.delivered(timeout=10)
            await anyio.to_thread.run_sync(
                kubelet.wait_list, lambda d: d == {GPU: "Unhealthy"}, "the GPU unhealthy")
            group.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(kubelet.stop)
    assert not (folder / "bcd-gpu.sock").exists()  # removed on the way out
    assert "kubelet: registered as bcd.dev/gpu (1 devices listed)" in lines


async def test_a_refused_register_is_tried_again_with_backoff_and_said(folder: Path) -> None:
    plugin = plugin_in(folder, [])
    kubelet = Kubelet(folder)
    kubelet.refuse = "the kubelet is busy"
    await anyio.to_thread.run_sync(kubelet.start)
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(plugin.run, "bcd.dev/gpu")
            await anyio.to_thread.run_sync(kubelet.wait_refused, 2)
            status = plugin.snapshot()
            assert not status["registered"]
            assert "the kubelet refused or did not answer Register (UNAVAILABLE: the kubelet " \
                "is busy); trying again in" in status["reason"]
            assert status["lastError"] == status["reason"]
            kubelet.refuse = None
            await anyio.to_thread.run_sync(kubelet.wait_registration, 1)
            await until(lambda: plugin.status.registered)
            assert plugin.snapshot()["registrations"] == 1
            group.cancel_scope.cancel()
    finally:
        await anyio.to_thread.run_sync(kubelet.stop)


async def test_a_socket_path_too_long_is_a_clear_reason(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 60) / "var/lib/kubelet/device-plugins"
    plugin = plugin_in(deep, [])
    async with anyio.create_task_group() as group:
        group.start_soon(plugin.run, "bcd.dev/gpu")
        await until(lambda: plugin.status.last_error is not None)
        assert "longer than a unix socket path may be (107 bytes)" in plugin.status.reason
        assert "[kubernetes] device_plugin_dir" in plugin.status.reason
        group.cancel_scope.cancel()


async def test_the_desired_state_turns_it_on_and_off(folder: Path) -> None:
    plugin = plugin_in(folder, [])
    wanted, resource = Pulse(), dict[str, str | None](name=None)
    async with anyio.create_task_group() as group:
        group.start_soon(plugin.supervise, lambda: resource["name"], wanted)
        await anyio.wait_all_tasks_blocked()
        assert not plugin.snapshot()["enabled"] and not folder.exists()
        assert plugin.snapshot()["reason"].startswith("the pool's policy has no kubernetes")
        resource["name"] = "bcd.dev/gpu"
        wanted.fire()
        await until(lambda: (folder / "bcd-gpu.sock").is_socket())
        assert plugin.snapshot()["resourceName"] == "bcd.dev/gpu"
        resource["name"] = None
        wanted.fire()
        # The socket goes first, then the status: await both (no order between them).
        await until(lambda: not (folder / "bcd-gpu.sock").exists()
                    and not plugin.snapshot()["enabled"])
        group.cancel_scope.cancel()


async def test_delivered_needs_no_stream_and_waits_for_each_open_one(folder: Path) -> None:
    plugin = plugin_in(folder, [])
    assert plugin.publish(held(GPU)) and not plugin.publish(held(GPU))  # same list: no news
    assert await plugin.delivered(timeout=1)  # nobody listening: nothing to wait for
    with plugin.stream() as stream:
        plugin.publish([])
        assert not await plugin.delivered(timeout=0.2)  # this stream has not sent it yet
        stream.sent(plugin.version)
        assert await plugin.delivered(timeout=1)
