"""The product broken on purpose, in a copy: for the tests that show a check catches a fault.

``mutated_copy(name, folder)`` copies the code into ``folder`` and applies one mutation of
``MUTATIONS`` (each edit's text must be there exactly once, so a mutation that no longer
applies fails loudly instead of testing nothing). Processes started with ``PYTHONPATH`` set
to the folder run the copy: it comes before the editable install on the path. Nothing here
is reachable from the product; the product has no switch a test could flip.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("domain", "projections", "api", "agent", "cli", "benchmarks")


@dataclass(frozen=True)
class Mutation:
    breaks: str  # the invariant of benchmarks/history_check.py it must break
    edits: tuple[tuple[str, str, str], ...]  # (file, text, replacement)


MUTATIONS = {
    # QuotaUse.take never refuses: a tenant can hold more than its quota.
    "quota-check-skipped": Mutation("quota-exceeded", (
        ("domain/quota.py", "if limit is not None and self.in_use + gpus > limit:",
         "if False:"),)),
    # The live window never sends reservation.extended to any stream.
    "watch-event-dropped": Mutation("watch-gap", (
        ("api/http/follower.py",
         "    def _matches(self, flt: EventFilter, i: int) -> bool:\n",
         "    def _matches(self, flt: EventFilter, i: int) -> bool:\n"
         "        if self._types[i] == 'reservation.extended':\n"
         "            return False\n"),)),
    # The live window's fast path (types only) taken for a tenant's stream too: no tenant
    # filter, every tenant's events go out.
    "watch-other-tenant": Mutation("watch-foreign-event", (
        ("api/http/follower.py",
         "return (flt.tenant_id is None and flt.actor is None",
         "return (flt.actor is None"),)),
    # A booking's start recorded 2 s before the time it was booked at (a clock read long
    # before the save): it overlaps the GPUs' previous booking when that ended just before.
    "booking-start-early": Mutation("gpu-booked-twice", (
        ("domain/bookings.py",
         "            start, end = free_from, end + (free_from - start)\n",
         "            start, end = free_from, end + (free_from - start)\n"
         "        start = start - __import__('datetime').timedelta(seconds=2)\n"),)),
    # A create answers first and saves a second later, in another thread: a save that loses
    # a race, or a worker killed meanwhile, loses an acknowledged reservation.
    "answer-before-commit": Mutation("acknowledged-lost", (
        ("api/services/reservations.py",
         "            self.store.save(rsv, bookings, *([quota] if quota is not None else []), "
         "*node,\n                            actor=principal.actor)\n",
         "            __import__('threading').Thread(target=lambda: (__import__('time')"
         ".sleep(1), self.store.save(rsv, bookings, *([quota] if quota is not None else "
         "[]), *node, actor=principal.actor)), daemon=True).start()\n"),)),
}


def mutated_copy(name: str, folder: Path) -> str:
    """The code with mutation ``name`` applied, under ``folder``; the PYTHONPATH that runs it."""
    package = folder / "better_compute"
    for each in PACKAGES:
        shutil.copytree(REPO / each, package / each,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for file, text, replacement in MUTATIONS[name].edits:
        path = package / file
        source = path.read_text()
        assert source.count(text) == 1, f"mutation {name}: {file} no longer holds {text!r}"
        path.write_text(source.replace(text, replacement))
    return str(folder)
