"""Binding a device assignment on the node, and releasing it.

The ``devices`` section of the node's desired state lists assignments
(api/wire/gateway.py)::

    {"allocationId": "alloc_…", "reservationId": "rsv_…", "gpus": ["GPU-…"],
     "cpus": 56, "memoryGiB": 480}

:func:`bind` turns one into a hold: the CDI spec, the env file and the slice,
after checking that every GPU is here and free. It returns a :class:`BindResult`
whose :meth:`~BindResult.journal_entry` is the ``allocation.bound`` or
``allocation.failed`` payload; :func:`release` undoes a hold and returns the
``allocation.released`` payload. The caller (bcd node's ``devices`` section) adds
``nodeId``, ``epoch`` and ``time``, signs and journals them. Both are idempotent:
binding the same assignment twice writes the same files, releasing twice is fine.

Order on bind: stale specs of the same GPUs are removed FIRST (two files naming one
device make runtimes drop it), then the spec, the env file and the slice. A bind
that fails part-way removes what it wrote for that allocation: a failed hold is no
hold. Order on release: spec first (no new container gets the GPUs), env file,
then the slice, stopped only once empty.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, Literal

import msgspec

from better_compute.api.wire.sections import Assignment

from . import cdi, envfile
from .gpu.model import Inventory
from .paths import Paths
from .slices import SliceError, SliceOutcome, Slices, slice_name

FailureReason = Literal["overlap", "device-missing", "resources-exhausted"]
_RESERVATION_ID = re.compile(r"^rsv_[A-Za-z0-9]{1,64}\Z")


class InvalidAssignment(ValueError):
    """The control plane sent an assignment bcd cannot act on (a bug, not a node fault)."""


DeviceAssignment = Assignment  # one entry of the ``devices`` section (api/wire/sections.py)


def parse_assignment(value: DeviceAssignment | Mapping[str, Any]) -> DeviceAssignment:
    """Decode and check one assignment; raises InvalidAssignment naming the problem."""
    if isinstance(value, DeviceAssignment):
        assignment = value
    else:
        try:
            assignment = msgspec.convert(value, DeviceAssignment)
        except msgspec.ValidationError as error:
            raise InvalidAssignment(f"device assignment: {error}") from None
    if not cdi.ALLOCATION_ID.match(assignment.allocation_id):
        raise InvalidAssignment(f"{assignment.allocation_id!r} is not an allocation id")
    if not _RESERVATION_ID.match(assignment.reservation_id):
        raise InvalidAssignment(f"{assignment.reservation_id!r} is not a reservation id")
    if not assignment.gpus:
        raise InvalidAssignment(f"assignment {assignment.allocation_id} holds no GPUs")
    if len(set(assignment.gpus)) != len(assignment.gpus):
        raise InvalidAssignment(f"assignment {assignment.allocation_id} names a GPU twice")
    return assignment


class BindResult(msgspec.Struct, kw_only=True):
    """What :func:`bind` did; ``outcome`` is ``bound`` or ``failed`` (with ``reason``)."""

    outcome: Literal["bound", "failed"]
    allocation_id: str
    gpus: list[str]
    reason: FailureReason | None = None
    message: str = ""
    cdi_devices: list[str] = []
    cdi_spec: str | None = None
    cdi_version: str | None = None
    env_file: str | None = None
    cgroup_parent: str | None = None
    slice_mode: str | None = None
    removed_stale: list[str] = []  # allocations whose stale spec named one of these GPUs

    @property
    def bound(self) -> bool:
        return self.outcome == "bound"

    def journal_entry(self) -> dict[str, Any]:
        """The ``allocation.bound`` / ``allocation.failed`` payload, less nodeId/epoch/time."""
        if self.bound:
            return {
                "kind": "allocation.bound",
                "allocationId": self.allocation_id,
                "gpus": list(self.gpus),
                "cdiDevices": list(self.cdi_devices),
                "envFile": self.env_file,
                "cgroupParent": self.cgroup_parent,
                "cdiSpec": self.cdi_spec,
            }
        return {
            "kind": "allocation.failed",
            "allocationId": self.allocation_id,
            "reason": self.reason,
            "message": self.message,
        }


class ReleaseResult(msgspec.Struct, kw_only=True):
    allocation_id: str
    removed_spec: bool
    removed_env_file: bool
    slice: SliceOutcome

    def journal_entry(self) -> dict[str, Any]:
        """The ``allocation.released`` payload, less nodeId/epoch/time."""
        return {"kind": "allocation.released", "allocationId": self.allocation_id}


def _failed(a: DeviceAssignment, reason: FailureReason, message: str) -> BindResult:
    return BindResult(outcome="failed", allocation_id=a.allocation_id, gpus=list(a.gpus),
                      reason=reason, message=message)


def _resources_in_use(paths: Paths, holds: Collection[str]) -> tuple[float, float]:
    cpus = memory = 0.0
    for allocation_id in holds:
        try:
            values = envfile.read_env_file(envfile.env_path(paths, allocation_id))
        except (OSError, ValueError):
            continue
        cpus += float(values.get("BCD_CPUS", 0) or 0)
        memory += float(values.get("BCD_MEMORY_GIB", 0) or 0)
    return cpus, memory


def _check_resources(
    a: DeviceAssignment, inventory: Inventory, paths: Paths, others: Collection[str]
) -> str | None:
    """Why the host's CPUs or memory cannot also carry this hold, or None when they can."""
    used_cpus, used_memory = _resources_in_use(paths, others)
    host = inventory.host
    if a.cpus and host.cpus is not None and used_cpus + a.cpus > host.cpus:
        return (f"{a.allocation_id} needs {a.cpus:g} CPUs but {host.cpus - used_cpus:g} of "
                f"{host.cpus} are left beside the other holds; release one or re-place")
    if a.memory_gib and host.memory_gib is not None and used_memory + a.memory_gib > host.memory_gib:
        return (f"{a.allocation_id} needs {a.memory_gib:g} GiB of memory but "
                f"{host.memory_gib - used_memory:g} of {host.memory_gib:g} GiB are left beside "
                "the other holds; release one or re-place")
    return None


def _missing_devices(a: DeviceAssignment, inventory: Inventory) -> str | None:
    """Why a GPU of the assignment cannot be held here (not on the node, or no CDI name)."""
    here = {gpu.uuid for gpu in inventory.gpus}
    missing = [uuid for uuid in a.gpus if uuid not in here]
    if missing:
        return (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not on this "
                f"node (it has {len(here)} GPUs); the inventory report shows which")
    invalid = [uuid for uuid in a.gpus if not cdi.is_valid_device_name(uuid)]
    if invalid:
        return (f"{', '.join(invalid)} cannot be a CDI device name (letters, digits and "
                "_ - . : only)")
    return None


def _others(a: DeviceAssignment, paths: Paths, live: Collection[str] | None
            ) -> tuple[list[str], list[str]] | str:
    """(stale holds to remove first, live holds beside this one), or why it overlaps one."""
    others = {alloc: gpus for alloc, gpus in cdi.read_holds(paths).items()
              if alloc != a.allocation_id}
    stale: list[str] = []
    for other, gpus in sorted(others.items()):
        shared = sorted(set(gpus) & set(a.gpus))
        if not shared:
            continue
        if live is None or other in live:
            return (f"{', '.join(shared)} already held by {other} "
                    f"({cdi.spec_path(paths, other)}); it must be released first")
        stale.append(other)
    return stale, [alloc for alloc in others if alloc not in stale
                   and (live is None or alloc in live)]


def _plan(a: DeviceAssignment, inventory: Inventory, paths: Paths, live: Collection[str] | None
          ) -> BindResult | tuple[list[str], dict[str, Any]]:
    """The stale holds to remove and the hold's CDI spec, or the failure that stops the bind
    before anything is written."""
    if problem := _missing_devices(a, inventory):
        return _failed(a, "device-missing", problem)
    others = _others(a, paths, live)
    if isinstance(others, str):
        return _failed(a, "overlap", others)
    stale, live_others = others
    if problem := _check_resources(a, inventory, paths, live_others):
        return _failed(a, "resources-exhausted", problem)
    try:
        return stale, cdi.derive_hold_spec(a.gpus, inventory, cdi.read_vendor_spec(paths))
    except (cdi.VendorSpecError, cdi.MissingVendorDevice) as error:
        return _failed(a, "device-missing", str(error))


def bind(
    assignment: DeviceAssignment | Mapping[str, Any],
    inventory: Inventory,
    paths: Paths,
    *,
    live: Collection[str] | None = None,
    slices: Slices | None = None,
) -> BindResult:
    """Hold the assignment's GPUs on this node.

    ``live`` is the set of allocation ids the desired state assigns now. Another
    hold on disk that names one of these GPUs is an overlap when its allocation is
    live, and a stale leftover (removed first) when it is not. Without ``live``
    every hold on disk counts as live: bcd never drops a hold on its own.

    Fails with ``device-missing`` (a GPU not in the inventory, or not described by
    the vendor spec), ``overlap`` or ``resources-exhausted`` (the host's CPUs or
    memory, or the slice could not be created). Raises InvalidAssignment for an
    assignment that is malformed.
    """
    a = parse_assignment(assignment)
    slices = slices if slices is not None else Slices.detect(paths)
    plan = _plan(a, inventory, paths, live)
    if isinstance(plan, BindResult):
        return plan
    stale, spec = plan
    for other in stale:
        cdi.remove_hold_spec(paths, other)
    values = envfile.hold_values(allocation_id=a.allocation_id, reservation_id=a.reservation_id,
                                 gpus=a.gpus, cpus=a.cpus, memory_gib=a.memory_gib)
    cdi.write_hold_spec(paths, a.allocation_id, spec)
    envfile.write_env_file(paths, a.allocation_id, values)
    try:
        outcome = slices.prepare(a.allocation_id)
    except SliceError as error:
        cdi.remove_hold_spec(paths, a.allocation_id)
        envfile.remove_env_file(paths, a.allocation_id)
        return _failed(a, "resources-exhausted", f"cannot create the hold's slice: {error}")
    return BindResult(
        outcome="bound", allocation_id=a.allocation_id, gpus=list(a.gpus),
        cdi_devices=[cdi.device_name(uuid) for uuid in a.gpus],
        cdi_spec=str(cdi.spec_path(paths, a.allocation_id)), cdi_version=spec["cdiVersion"],
        env_file=str(envfile.env_path(paths, a.allocation_id)),
        cgroup_parent=slice_name(a.allocation_id), slice_mode=outcome.mode, removed_stale=stale,
    )


def release(allocation_id: str, paths: Paths, *, slices: Slices | None = None) -> ReleaseResult:
    """Remove the hold's CDI spec, then its env file, then stop its slice once empty.

    A slice that still runs workloads is left (``slice.state == "busy"``) and
    stopped by a later :meth:`Slices.sweep`; the release itself is complete and
    is journaled either way, since the GPUs are no longer exposed by bcd.
    """
    cdi.check_allocation_id(allocation_id)
    slices = slices if slices is not None else Slices.detect(paths)
    removed_spec = cdi.remove_hold_spec(paths, allocation_id)
    removed_env = envfile.remove_env_file(paths, allocation_id)
    return ReleaseResult(allocation_id=allocation_id, removed_spec=removed_spec,
                         removed_env_file=removed_env, slice=slices.stop_if_empty(allocation_id))


def held_allocations(paths: Paths) -> list[str]:
    """Allocation ids that have a hold on disk (spec or env file), for reconciling."""
    found = set(cdi.read_holds(paths))
    if paths.allocations.is_dir():
        found |= {p.stem for p in paths.allocations.glob("alloc_*.env")
                  if cdi.ALLOCATION_ID.match(p.stem)}
    return sorted(found)


__all__ = [
    "BindResult",
    "DeviceAssignment",
    "InvalidAssignment",
    "ReleaseResult",
    "bind",
    "held_allocations",
    "parse_assignment",
    "release",
]
