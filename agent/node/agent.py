"""`bcd node`'s long-lived state and its tasks: GPU monitor, applier, session, status.

One composition: :class:`NodeAgent` owns the GPU source, the journal and the state
file; :meth:`NodeAgent.run` starts, in one task group, the status server on the unix
socket, the monitor (reads the GPUs every ``poll_seconds`` and reports when their
health changes), the applier (applies desired state whenever a new one arrives) and
the session loop (agent/node/session.py: connect, Hello/Welcome, reconnect with
backoff). Nothing here drops a hold: holds change only when the applier applies a
``devices`` section the gateway sent.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

import anyio
import msgspec

from better_compute.api.wire import logs
from better_compute.api.wire.sections import profile_units

from ..errors import BcdError
from ..gpu import GpuSource, GpuSourceError, Inventory
from ..kubelet.devices import advertised, resource_name
from ..kubelet.plugin import DevicePlugin
from ..paths import Paths
from ..times import rfc3339
from ..version import bcd_version
from .apply import ApplyContext, apply_desired
from .backoff import Backoff
from .devices import DevicesApplier, find_applier
from .journal import Journal
from .pulse import Pulse
from .renewal import CertificateWindow, check_renewed, install, make_csr, read_window
from .settings import NodeKey, NodeSettings
from .state import (
    NodeState,
    load_state,
    mark_removed,
    removed_marker,
    save_state,
    state_dir,
)

STATUS_SCHEMA_VERSION = 1


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class NodeOptions:
    heartbeat_seconds: float = 5.0  # until the gateway's Welcome says otherwise
    poll_seconds: float | None = None  # GPU reads; default: the heartbeat interval
    report_every: int = 6  # a telemetry Report every N heartbeats
    welcome_timeout: float = 15.0
    renew_check_seconds: float = 3600.0  # how often a session checks the certificate's age
    renew_retry_seconds: float = 600.0  # after a refused or unanswered Renew
    renew_answer_timeout: float = 30.0
    backoff: Backoff = field(default_factory=Backoff)
    out: TextIO = field(default_factory=lambda: sys.stdout)
    log_format: str = "text"  # or json (api/wire/logs.py)
    metrics_socket: socket.socket | None = None  # bound for GET /metrics (agent/node/metrics.py)


@dataclass
class RenewalInfo:
    renewals: int = 0
    last_renewed: str | None = None
    last_error: str | None = None
    answer: anyio.Event | None = None  # set by the reader on Renewed or a renew_* refusal


@dataclass
class SessionInfo:
    state: str = "connecting"  # connecting | connected | disconnected
    epoch: int | None = None
    since: str | None = None
    last_error: str | None = None
    connects: int = 0


def _health_shape(inventory: Inventory | None, error: str | None) -> Any:
    if inventory is None:
        return ("error", error)
    return tuple((gpu.uuid, gpu.healthy, tuple(gpu.health_reasons), gpu.family, gpu.memory_mib)
                 for gpu in inventory.gpus)


class NodeAgent:
    def __init__(self, settings: NodeSettings, paths: Paths, source: GpuSource, key: NodeKey, *,
                 options: NodeOptions | None = None,
                 clock: Callable[[], datetime] = utc_now,
                 devices: DevicesApplier | None = None) -> None:
        self.settings = settings
        self.paths = paths
        self.source = source
        self.key = key
        self.options = options or NodeOptions()
        self.clock = clock
        self.devices = devices or find_applier()
        self.heartbeat_seconds = self.options.heartbeat_seconds
        folder = state_dir(paths)
        self.state_path = folder / "state.json"
        self.state: NodeState = load_state(self.state_path, settings.identity.node_id)
        self.journal = Journal(folder / "journal.jsonl", key)
        self.session = SessionInfo()
        self.inventory: Inventory | None = None
        self.source_error: str | None = None
        self.inventory_time: str | None = None
        self._shape: Any = None
        # A restart between receiving and applying a desired state applies it now.
        self._dirty = self.state.applied_generation != self.state.observed_generation
        self._pending: tuple[int, dict[str, Any]] | None = None
        self.certificate = read_window(settings.certificate_path)
        self.renewal = RenewalInfo()
        self.tls_changed = False  # node.crt was renewed: the next connection reloads it
        self.kubelet = DevicePlugin(settings.device_plugin_dir or paths.device_plugins,
                                    say=self.say, now=self.now)
        self._toolkit_basis: Any = None  # the GPU set and driver the toolkit unit last saw
        self.removed: str | None = None  # why the control plane removed this node
        self.stop_requested: anyio.Event | None = None

    # -- output ----------------------------------------------------------------

    def say(self, line: str, level: str = "info") -> None:
        """One log line: time, level, ``bcd node:``, the message (docs/bcd.md, "Output")."""
        print(logs.line(self.options.log_format, time.time(), level, "bcd node", line),
              file=self.options.out, flush=True)

    def now(self) -> str:
        return rfc3339(self.clock())

    # -- the GPUs --------------------------------------------------------------

    def _read_inventory(self) -> tuple[Inventory | None, str | None]:
        try:
            return self.source.inventory(), None
        except GpuSourceError as exc:
            return None, str(exc)

    async def refresh_inventory(self) -> bool:
        """Read the GPUs afresh; True when their health or identity changed."""
        async with self._source_lock:
            inventory, error = await anyio.to_thread.run_sync(self._read_inventory)
        self.inventory, self.source_error, self.inventory_time = inventory, error, self.now()
        shape = _health_shape(inventory, error)
        changed = bool(shape != self._shape)
        if changed and self._shape is not None:
            self._log_health_change(inventory, error)
        self._shape = shape
        return changed

    def _log_health_change(self, inventory: Inventory | None, error: str | None) -> None:
        if inventory is None:
            self.say(f"GPU source error: {error}", "warning")
            return
        for gpu in inventory.gpus:
            state = "healthy" if gpu.is_healthy else f"unhealthy ({', '.join(gpu.health_reasons)})"
            held = self.state.holds.get(gpu.uuid)
            self.say(f"GPU {gpu.index} ({gpu.uuid}) {state}"
                     + (f", still held by {held}" if held else ""),
                     "info" if gpu.is_healthy else "warning")

    async def _monitor(self) -> None:
        while True:
            await anyio.sleep(self.options.poll_seconds or self.heartbeat_seconds)
            if await self.refresh_inventory():
                self.report_wanted.fire()
                self.publish_to_kubelet(self.state.desired_sections)
            if self._toolkit_due():
                self._dirty = True  # the container-toolkit unit regenerates nvidia.json
                self.apply_wanted.fire()

    # -- the kubelet's device plugin and the container toolkit (docs/kubernetes.md) ---

    def publish_to_kubelet(self, sections: dict[str, Any]) -> list[str]:
        """List for the kubelet what ``sections`` hands it of the holds; the withdrawn ids."""
        before = {device.id for device in self.kubelet.devices}
        self.kubelet.publish(advertised(sections, self.state.holds, self.inventory,
                                        self.source_error))
        return sorted(before - {device.id for device in self.kubelet.devices})

    async def _withdraw_first(self, sections: dict[str, Any]) -> None:
        """Before a release: the kubelet is sent the list without its GPUs, then bcd goes on."""
        gone = self.publish_to_kubelet(sections)
        if gone:
            sent = await self.kubelet.delivered()
            self.say(f"kubelet: withdrew {len(gone)} GPU(s) before releasing their hold"
                     + ("" if sent else " (a ListAndWatch stream did not take the new list "
                        "within 5s)"))

    def _toolkit_due(self) -> bool:
        """True once when the GPU set or driver changed under a profile with the toolkit."""
        if self.inventory is None or \
                "container-toolkit" not in profile_units(self.state.desired_sections):
            return False
        basis = (sorted(gpu.uuid for gpu in self.inventory.gpus), self.inventory.driver_version)
        due = self._toolkit_basis is not None and basis != self._toolkit_basis
        self._toolkit_basis = basis
        return due

    # -- desired state ---------------------------------------------------------

    def on_desired(self, generation: int, sections: dict[str, Any]) -> None:
        """A DesiredState from the gateway: wake the applier (or just report when unchanged)."""
        if self._pending is None and not self._dirty and \
                generation == self.state.observed_generation and \
                sections == self.state.desired_sections:
            self.report_wanted.fire()  # nothing new (a resend after Welcome): say where we are
            return
        self._pending = (generation, sections)
        self.apply_wanted.fire()

    def _apply(self, state: NodeState, context: ApplyContext) -> tuple[NodeState, int]:
        written = apply_desired(state, self.journal, context)
        save_state(self.state_path, state)
        return state, len(written)

    async def _applier(self) -> None:
        while True:
            wake = self.apply_wanted.waiter()
            if self._dirty or self._pending is not None:
                self._dirty = False
                await self.refresh_inventory()
                # Applied on a copy in a worker thread; the status server reads the original.
                work = msgspec.convert(msgspec.to_builtins(self.state), NodeState)
                if self._pending is not None:
                    work.observed_generation, work.desired_sections = self._pending
                    self._pending = None
                context = ApplyContext(
                    node_id=self.settings.identity.node_id,
                    epoch=self.session.epoch or self.state.last_epoch, time=self.now(),
                    inventory=self.inventory, source_error=self.source_error,
                    paths=self.paths, devices=self.devices,
                    cdi_generate=self.settings.cdi_generate,
                )
                await self._withdraw_first(work.desired_sections)
                result, written = await anyio.to_thread.run_sync(self._apply, work, context)
                result.last_epoch = max(result.last_epoch, self.state.last_epoch)
                self.state = result
                self.publish_to_kubelet(self.state.desired_sections)
                self.kubelet_wanted.fire()
                for name, section in self.state.sections.items():
                    self.say(f"section {name}: {section.state}: {section.message}")
                if written:
                    self.journal_added.fire()
                self.report_wanted.fire()
                continue
            await wake.wait()

    # -- certificate renewal (agent/node/renewal.py) ------------------------------

    def renewal_due(self) -> bool:
        return self.certificate is not None and self.certificate.due(self.clock())

    def renewal_csr(self) -> str:
        return make_csr(self.key, self.settings.identity.node_id)

    def on_renewed(self, certificate_pem: str, not_after: str) -> None:
        """A Renewed from the gateway: check it, write node.crt, use it from the next connect.

        Runs in a worker thread (it writes files); :meth:`renewal_answered` follows it.
        """
        info = self.renewal
        try:
            cert = check_renewed(certificate_pem, self.key, self.settings.identity.node_id,
                                 self.settings.node_ca_path)
            install(self.settings, cert, not_after)
        except (BcdError, OSError) as exc:
            info.last_error = str(exc)
            self.say(f"certificate renewal failed: {exc}", "error")
        else:
            self.certificate = CertificateWindow(cert.not_valid_before_utc,
                                                 cert.not_valid_after_utc)
            self.tls_changed = True
            info.renewals += 1
            info.last_renewed, info.last_error = self.now(), None
            self.say(f"certificate renewed; valid until {rfc3339(cert.not_valid_after_utc)}")

    def on_renew_refused(self, code: str, message: str) -> None:
        self.renewal.last_error = f"{code}: {message}"
        self.say(f"certificate renewal refused: {code}: {message}")

    def renewal_answered(self) -> None:
        """Wake the session's renewal task (call from the event loop, never a thread)."""
        if self.renewal.answer is not None:
            self.renewal.answer.set()

    def on_removed(self, message: str) -> None:
        """The control plane removed this node: say so and stop (no reconnecting)."""
        self.removed = message
        self.session.last_error = message
        try:  # so that `bcd join` joins again (and gets the same node back)
            mark_removed(self.paths, self.settings.identity.node_id, message)
        except OSError as exc:
            self.say(f"cannot write {removed_marker(self.paths)}: {exc.strerror}")
        self.say(f"the control plane removed this node: {message}; stopping", "warning")
        if self.stop_requested is not None:
            self.stop_requested.set()

    # -- journal answers -------------------------------------------------------

    def settle(self, seq: int, outcome: str) -> None:
        self.journal.settle(seq, outcome)

    # -- run -------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        from .session import session_loop
        from .status_server import serve_status

        self.stop_requested = anyio.Event()
        self.apply_wanted = Pulse()
        self.report_wanted = Pulse()
        self.journal_added = Pulse()
        self.kubelet_wanted = Pulse()
        self._source_lock = anyio.Lock()
        await self.refresh_inventory()
        self.publish_to_kubelet(self.state.desired_sections)  # the holds kept over a restart
        self._toolkit_due()  # what the toolkit unit's GPUs and driver are now
        async with anyio.create_task_group() as group:
            await group.start(serve_status, self)
            if self.options.metrics_socket is not None:
                await self._serve_metrics(group, self.options.metrics_socket)
            self.say(f"status on {self.paths.socket}; connecting to {self.settings.gateway.url}")
            group.start_soon(self._monitor)
            group.start_soon(self._applier)
            group.start_soon(session_loop, self)
            group.start_soon(self.kubelet.supervise,
                             lambda: resource_name(self.state.desired_sections),
                             self.kubelet_wanted)
            task_status.started()

    async def _serve_metrics(self, group: anyio.abc.TaskGroup, sock: socket.socket) -> None:
        from better_compute.api.wire.daemon import serve_scrape

        from .metrics import registry_for, render

        registry = registry_for(self)

        async def scrape() -> bytes:
            return render(registry)  # memory only: the agent's last GPU read and its holds

        host, port = sock.getsockname()[:2]
        await group.start(serve_scrape, sock, scrape)
        shown = f"[{host}]" if ":" in host else host
        self.say(f"metrics on http://{shown}:{port}/metrics")

    # -- status ----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What `bcd status --json` prints; docs/bcd.md documents this schema (version 1)."""
        identity = self.settings.identity
        holds = dict(self.state.holds)
        gpus = []
        for gpu in self.inventory.gpus if self.inventory else []:
            gpus.append({
                "index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "family": gpu.family,
                "pciBusId": gpu.pci_bus_id, "nvlinkDomain": gpu.nvlink_domain,
                "numaNode": gpu.numa_node,
                "healthy": gpu.is_healthy, "healthReasons": list(gpu.health_reasons),
                "utilizationPct": gpu.utilization_pct, "temperatureC": gpu.temperature_c,
                "powerW": gpu.power_w, "memoryUsedMiB": gpu.memory_used_mib,
                "memoryMiB": gpu.memory_mib, "heldBy": holds.get(gpu.uuid),
            })
        unsettled = self.journal.unsettled()
        return {
            "schemaVersion": STATUS_SCHEMA_VERSION,
            "time": self.now(),
            "bcdVersion": bcd_version(),
            "node": {"id": identity.node_id, "siteId": identity.site_id,
                     "poolId": identity.pool_id, "tenantId": identity.tenant_id},
            "session": {"state": self.session.state, "epoch": self.session.epoch,
                        "gateway": self.settings.gateway.url, "since": self.session.since,
                        "lastError": self.session.last_error,
                        "connects": self.session.connects},
            "spec": {"appliedGeneration": self.state.applied_generation,
                     "observedGeneration": self.state.observed_generation},
            "sections": {name: msgspec.to_builtins(section)
                         for name, section in sorted(self.state.sections.items())},
            "gpus": gpus,
            "holds": holds,
            "gpuSource": {"name": self.source.name, "error": self.source_error,
                          "readAt": self.inventory_time},
            "journal": {"entries": len(self.journal.entries()), "unacknowledged": len(unsettled)},
            "certificate": {
                "notAfter": rfc3339(self.certificate.not_after) if self.certificate else None,
                "renewals": self.renewal.renewals, "lastRenewed": self.renewal.last_renewed,
                "lastError": self.renewal.last_error},
            "kubernetes": self.kubelet.snapshot(),
        }
