"""GPU health from XID events: a fault marks a GPU unhealthy for a window."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["APPLICATION_XIDS", "DEFAULT_XID_WINDOW_S", "HealthTracker", "is_application_xid"]

# XIDs that NVIDIA's Kubernetes device plugin treats as application errors (a
# program faulted or was killed), not as faults of the GPU.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})
DEFAULT_XID_WINDOW_S = 600.0


def is_application_xid(xid: int) -> bool:
    return xid in APPLICATION_XIDS


class HealthTracker:
    """Remembers hardware XIDs per GPU and how long ago they happened.

    A GPU with a hardware XID within the last ``window_s`` seconds is unhealthy
    with reason ``xid-<n>``. Once the window passes the reason goes away on its
    own, so a GPU recovers without restarting bcd (ECC and retired-page checks
    still hold it unhealthy while those counters are set). An XID whose GPU is
    unknown (``uuid`` None) counts against every GPU, as NVIDIA's device plugin
    does.
    """

    def __init__(
        self,
        window_s: float = DEFAULT_XID_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        self.window_s = window_s
        self._clock = clock
        self._lock = threading.Lock()
        # uuid (None: every GPU) -> xid -> time it was last seen
        self._seen: dict[str | None, dict[int, float]] = {}

    def record(self, uuid: str | None, xid: int) -> bool:
        """Record an XID; returns False (and records nothing) for application XIDs."""
        if is_application_xid(xid):
            return False
        with self._lock:
            self._seen.setdefault(uuid, {})[xid] = self._clock()
        return True

    def reasons(self, uuid: str) -> list[str]:
        """Health reasons (``xid-<n>``, sorted by XID) for one GPU right now."""
        now = self._clock()
        with self._lock:
            self._forget_before(now - self.window_s)
            xids = set(self._seen.get(uuid, {})) | set(self._seen.get(None, {}))
        return [f"xid-{xid}" for xid in sorted(xids)]

    def _forget_before(self, cutoff: float) -> None:
        for key in list(self._seen):
            recent = {xid: at for xid, at in self._seen[key].items() if at > cutoff}
            if recent:
                self._seen[key] = recent
            else:
                del self._seen[key]
