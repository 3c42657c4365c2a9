"""The ``devices`` section: device assignments (holds), bound through agent/binding.py.

:func:`bind_devices` reconciles the holds on disk with the desired assignments, using
agent/binding.py's ``bind`` and ``release`` (CDI spec, env file, slice):

* an assignment not held yet is bound once; its ``allocation.bound`` or
  ``allocation.failed`` fact is journaled once (a failed one is final: the control plane
  places it again under a new allocation id);
* a hold whose allocation left the assignments is released, journaled once as
  ``allocation.released``;
* nothing else ever releases a hold: not a GPU turning unhealthy, not a lost session, and
  not an absent ``devices`` section (apply.py does not call this then).

An applier returns a :class:`DevicesOutcome`: the section's state and message, the
complete GPU -> allocation map of holds, and ``(key, body)`` journal facts; the node adds
``nodeId``, ``epoch`` and ``time``, signs and journals each key once. ``done(key)`` says
whether a key is journaled already. Without agent/binding.py (an older build) the section
says device assignments are not supported.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from better_compute.api.wire.sections import DevicesSection

from ..gpu import Inventory
from ..paths import Paths


@dataclass
class DevicesOutcome:
    state: str  # applied | failed | unsupported
    message: str
    holds: dict[str, str]
    entries: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


class DevicesApplier(Protocol):
    def __call__(self, section: DevicesSection, *, paths: Paths, inventory: Inventory | None,
                 holds: dict[str, str], done: Callable[[str], bool]) -> DevicesOutcome: ...


def unsupported(section: DevicesSection, *, paths: Paths, inventory: Inventory | None,
                holds: dict[str, str], done: Callable[[str], bool]) -> DevicesOutcome:
    """The stand-in while agent/binding.py is absent: records, holds nothing new."""
    assignments = section.assignments
    if not assignments:
        return DevicesOutcome("applied", "no device assignments", dict(holds))
    return DevicesOutcome(
        "unsupported",
        f"device assignments are not supported by this bcd yet ({len(assignments)} "
        "assignment(s) not bound); upgrade bcd",
        dict(holds),
    )


def bind_devices(section: DevicesSection, *, paths: Paths, inventory: Inventory | None,
                 holds: dict[str, str], done: Callable[[str], bool]) -> DevicesOutcome:
    from .. import binding, cdi

    problems: list[str] = []
    assignments = []
    for item in section.assignments:
        try:
            assignments.append(binding.parse_assignment(item))
        except binding.InvalidAssignment as exc:
            problems.append(str(exc))
    live = {a.allocation_id for a in assignments}
    entries: list[tuple[str, dict[str, Any]]] = []
    on_disk = cdi.read_holds(paths)
    released = 0
    for allocation_id in sorted((set(holds.values()) | set(binding.held_allocations(paths)))
                                - live):
        entries.append((f"allocation.released/{allocation_id}",
                        binding.release(allocation_id, paths).journal_entry()))
        released += 1
    bound = failed = 0
    for a in assignments:
        if done(f"allocation.failed/{a.allocation_id}"):
            failed += 1
            continue
        if done(f"allocation.bound/{a.allocation_id}") and \
                sorted(on_disk.get(a.allocation_id, [])) == sorted(a.gpus):
            bound += 1
            continue
        if inventory is None:
            problems.append(f"{a.allocation_id} not bound yet: the GPU source cannot be read")
            continue
        result = binding.bind(a, inventory, paths, live=live)
        entries.append((f"{'allocation.bound' if result.bound else 'allocation.failed'}/"
                        f"{a.allocation_id}", result.journal_entry()))
        if result.bound:
            bound += 1
        else:
            failed += 1
            problems.append(f"{a.allocation_id} failed ({result.reason}): {result.message}")
    new_holds = {gpu: alloc for alloc, gpus in cdi.read_holds(paths).items() for gpu in gpus}
    for gpu, alloc in holds.items():  # a live hold whose file vanished is still a hold
        if alloc in live and not done(f"allocation.failed/{alloc}"):
            new_holds.setdefault(gpu, alloc)
    summary = f"{bound} bound, {failed} failed, {released} released"
    if not assignments and not released and not problems:
        summary = "no device assignments"
    message = "; ".join([summary, *problems])
    return DevicesOutcome("failed" if problems else "applied", message, new_holds, entries)


def find_applier() -> DevicesApplier:
    """:func:`bind_devices` when agent/binding.py is part of this bcd, else :func:`unsupported`."""
    try:
        importlib.import_module("better_compute.agent.binding")
    except ModuleNotFoundError as exc:
        if exc.name != "better_compute.agent.binding":
            raise
        return unsupported
    return bind_devices
