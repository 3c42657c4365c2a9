"""XID events from NVML: the driver's reports of GPU faults."""

from __future__ import annotations

import ctypes
import logging
from types import ModuleType
from typing import Any

import msgspec

from .errors import GpuSourceError
from .health import APPLICATION_XIDS

__all__ = ["APPLICATION_XIDS", "XidEvent", "XidWatcher"]

log = logging.getLogger(__name__)

# Bounds one poll() so a storm of events cannot keep it draining forever.
MAX_EVENTS_PER_POLL = 1024


class XidEvent(msgspec.Struct, frozen=True, rename="camel"):
    """An XID reported for one GPU; ``uuid`` is None when NVML did not say which."""

    uuid: str | None
    xid: int

    @property
    def application(self) -> bool:
        return self.xid in APPLICATION_XIDS


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_address(handle: Any) -> int | None:
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class XidWatcher:
    """Receives XID critical-error events for every GPU of an initialised NVML.

    The caller owns nvmlInit/nvmlShutdown; the watcher owns its event set. GPUs
    that cannot deliver events (not supported, no permission) are skipped and
    listed in ``unwatched``.
    """

    def __init__(self, nvml: ModuleType | Any) -> None:
        self._nvml = nvml
        self._uuids: dict[int, str] = {}
        self.unwatched: list[int] = []
        try:
            self._set = nvml.nvmlEventSetCreate()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise GpuSourceError(f"cannot watch XID events through NVML: {error}") from error
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._set)
            except nvml.NVMLError as error:
                log.warning("GPU %d: XID events unavailable (%s)", index, error)
                self.unwatched.append(index)
                continue
            address = _handle_address(handle)
            if address is not None:
                self._uuids[address] = uuid
        self._closed = False

    def poll(self, timeout_ms: int = 0) -> list[XidEvent]:
        """Wait up to ``timeout_ms`` for an event, then drain whatever else is queued."""
        nvml = self._nvml
        events: list[XidEvent] = []
        wait = max(0, int(timeout_ms))
        while not self._closed and len(events) < MAX_EVENTS_PER_POLL:
            try:
                data = nvml.nvmlEventSetWait(self._set, wait)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError as error:
                raise GpuSourceError(f"waiting for NVML XID events failed: {error}") from error
            wait = 0
            if data.eventType != nvml.nvmlEventTypeXidCriticalError:
                continue
            events.append(XidEvent(uuid=self._uuid_of(data.device), xid=int(data.eventData)))
        return events

    def _uuid_of(self, handle: Any) -> str | None:
        address = _handle_address(handle)
        if not address:
            return None
        if address in self._uuids:
            return self._uuids[address]
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError:
            return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except self._nvml.NVMLError as error:
            log.debug("nvmlEventSetFree failed: %s", error)
