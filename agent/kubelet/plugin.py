"""bcd's device plugin: the list the kubelet sees, and its life beside the kubelet.

:class:`DevicePlugin` keeps the devices to list (bcd node publishes them whenever a hold is
bound or released or a GPU's health changes) and, while the pool's desired state has a
``kubernetes`` section, :meth:`DevicePlugin.supervise` serves the DevicePlugin service on
``bcd-gpu.sock`` in the kubelet's device-plugin folder and registers with the kubelet's
``kubelet.sock`` there (service.py; gRPC is imported only then).

The kubelet restarts now and then: a new kubelet removes every socket in the folder and
creates kubelet.sock afresh. bcd looks at both sockets every ``poll_seconds``: when its own
socket is gone it serves a new one, and when kubelet.sock is a new file it registers again.
A refused or unanswered Register is tried again with backoff (0.5 s doubling to 5 s), and
at once when kubelet.sock changes. On the way out bcd removes its socket.

Releases withdraw before they remove: :meth:`DevicePlugin.delivered` waits until every open
ListAndWatch stream has been sent the newest list, so bcd node removes a hold's CDI spec
only after the kubelet was told the GPUs are gone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..node.backoff import Backoff
from ..node.pulse import Pulse
from .devices import KubeletDevice

SOCKET_NAME = "bcd-gpu.sock"
KUBELET_SOCKET = "kubelet.sock"
MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108 with the terminating NUL
OFF = "the pool's policy has no kubernetes: nothing is handed to a kubelet"


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is now (inode, change time), None when it is absent."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_ino, info.st_ctime_ns


@dataclass
class _Stream:
    """One open ListAndWatch stream and the newest list version it was sent."""

    plugin: DevicePlugin
    version: int = -1

    def sent(self, version: int) -> None:
        self.version = version
        self.plugin._sent.fire()


@dataclass
class PluginStatus:
    resource: str | None = None
    registered: bool = False
    since: str | None = None
    registrations: int = 0
    reason: str = OFF
    last_error: str | None = None


@dataclass
class DevicePlugin:
    """The list the kubelet sees and the plugin's state, for one node."""

    folder: Path  # the kubelet's device-plugin folder
    say: Callable[[str], None]
    now: Callable[[], str]
    poll_seconds: float = 0.5
    devices: list[KubeletDevice] = field(default_factory=list)
    version: int = 0
    status: PluginStatus = field(default_factory=PluginStatus)

    def __post_init__(self) -> None:
        # Events are made on first use, inside the event loop (bcd node builds this before).
        self._changed: anyio.Event | None = None
        self._sent_pulse: Pulse | None = None
        self._streams: list[_Stream] = []

    @property
    def _sent(self) -> Pulse:
        if self._sent_pulse is None:
            self._sent_pulse = Pulse()
        return self._sent_pulse

    @property
    def socket(self) -> Path:
        return self.folder / SOCKET_NAME

    @property
    def kubelet_socket(self) -> Path:
        return self.folder / KUBELET_SOCKET

    # -- the list ------------------------------------------------------------------

    def publish(self, devices: list[KubeletDevice]) -> bool:
        """Make ``devices`` the list; wakes every ListAndWatch stream. False if unchanged."""
        if devices == self.devices:
            return False
        self.devices = list(devices)
        self.version += 1
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()
        return True

    def changed(self) -> anyio.Event:
        """An event set at the next :meth:`publish` that changes the list."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    @contextlib.contextmanager
    def stream(self) -> Iterator[_Stream]:
        stream = _Stream(self)
        self._streams.append(stream)
        try:
            yield stream
        finally:
            self._streams.remove(stream)
            self._sent.fire()

    async def delivered(self, timeout: float = 5.0) -> bool:
        """Wait until every open stream was sent the newest list; False after ``timeout``."""
        with anyio.move_on_after(timeout):
            while True:
                wake = self._sent.waiter()
                if all(stream.version >= self.version for stream in self._streams):
                    return True
                await wake.wait()
        return False

    # -- running -------------------------------------------------------------------

    async def supervise(self, resource_of: Callable[[], str | None], wanted: Pulse) -> None:
        """Run the plugin while ``resource_of()`` names a resource; ``wanted`` fires on change."""
        while True:
            wake = wanted.waiter()
            resource = resource_of()
            if resource is None:
                self.status = PluginStatus()
                await wake.wait()
                continue
            async with anyio.create_task_group() as group:
                group.start_soon(self.run, resource)
                while True:
                    wake = wanted.waiter()
                    if resource_of() != resource:
                        break
                    await wake.wait()
                group.cancel_scope.cancel()

    async def run(self, resource: str) -> None:
        """Serve and stay registered as ``resource`` until cancelled."""
        self.status = PluginStatus(resource=resource, reason="starting")
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            self._not_registered(
                f"the plugin socket {self.socket} is longer than a unix socket path may be "
                f"({MAX_SOCKET_PATH} bytes): set [kubernetes] device_plugin_dir in config.toml "
                "to the kubelet's folder by a shorter path", error=True)
            await anyio.sleep_forever()
        from . import service  # gRPC only on nodes whose pool turned the plugin on

        backoff = Backoff(base=0.5, cap=5.0)
        try:
            while True:
                try:
                    self.folder.mkdir(parents=True, exist_ok=True, mode=0o750)
                    async with service.serving(self, resource, self.socket):
                        await self._stay_registered(service, resource, _identity(self.socket),
                                                    backoff)
                except OSError as exc:
                    self._not_registered(f"cannot serve {self.socket}: {exc}", error=True)
                    await anyio.sleep(backoff.next_delay())
        finally:
            with contextlib.suppress(OSError):
                self.socket.unlink()
            self.status.registered = False

    async def _stay_registered(self, service: Any, resource: str,
                               own: tuple[int, int] | None, backoff: Backoff) -> None:
        """Register, and again whenever kubelet.sock is a new file; return when our socket goes."""
        registered_with: tuple[int, int] | None = None
        failed_with: tuple[int, int] | None = None
        retry_at = 0.0
        while _identity(self.socket) == own:
            kubelet = _identity(self.kubelet_socket)
            if kubelet is None:
                registered_with = None
                self._not_registered(f"no kubelet socket at {self.kubelet_socket}: waiting for "
                                     "the kubelet (bcd registers as soon as it appears)")
            elif kubelet != registered_with:
                if kubelet != failed_with:
                    backoff.reset()
                    retry_at = 0.0
                if anyio.current_time() >= retry_at:
                    try:
                        await service.register(self.kubelet_socket, SOCKET_NAME, resource)
                    except OSError as exc:
                        failed_with, delay = kubelet, backoff.next_delay()
                        retry_at = anyio.current_time() + delay
                        self._not_registered(f"the kubelet refused or did not answer Register "
                                             f"({exc}); trying again in {delay:.1f}s", error=True)
                    else:
                        registered_with, failed_with = kubelet, None
                        self._registered(resource)
            await anyio.sleep(self.poll_seconds)
        self.say(f"kubelet: {self.socket} was removed (the kubelet restarted?): serving it again")

    def _registered(self, resource: str) -> None:
        status = self.status
        status.registered, status.since, status.reason = True, self.now(), "registered"
        status.registrations += 1
        status.last_error = None
        self.say(f"kubelet: registered as {resource} ({len(self.devices)} devices listed)")

    def _not_registered(self, why: str, *, error: bool = False) -> None:
        status = self.status
        if error:
            status.last_error = why
        if status.registered or status.reason != why:
            status.registered, status.since, status.reason = False, self.now(), why
            self.say(f"kubelet: not registered: {why}")

    # -- bcd status ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The ``kubernetes`` part of `bcd status --json` (docs/bcd.md)."""
        status = self.status
        return {
            "enabled": status.resource is not None,
            "resourceName": status.resource,
            "registered": status.registered,
            "reason": status.reason,
            "since": status.since,
            "registrations": status.registrations,
            "lastError": status.last_error,
            "socket": str(self.socket),
            "kubeletSocket": str(self.kubelet_socket),
            "streams": len(self._streams),
            "devices": [{"id": d.id, "health": d.health, "allocationId": d.allocation_id,
                         "reservationId": d.reservation_id, "numaNode": d.numa_node,
                         "reasons": list(d.reasons)} for d in self.devices],
        }
