"""The history checker's short schedule, and the checker catching the product broken on purpose.

benchmarks/history.py runs clients, watchers and faults against real ``serve`` processes (two
replicas on one PostgreSQL; SQLite with workers), records everything, and
benchmarks/history_check.py checks the invariants on the record. Here: a short schedule on each
backend breaks none of them, and each mutation of tests/mutations.py (a copy of the code broken
on purpose) is reported as the invariant it breaks, with the slice of history that shows it
(on SQLite: what each breaks lies above the store, and the checker reads only the record).
The long schedule is ``python -m better_compute.benchmarks.history --minutes N``
(docs/operations.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from better_compute.benchmarks.history import run_schedule
from better_compute.benchmarks.history_check import INVARIANTS, describe
from tests.mutations import MUTATIONS, mutated_copy
from tests.support import free_port

SHORT_SECONDS = 30.0  # of clients and faults; set-up and the checks come on top


def test_a_short_schedule_with_faults_breaks_no_invariant(backend: str, tmp_path: Path) -> None:
    outcome = run_schedule(tmp_path, seconds=SHORT_SECONDS, backend=backend,
                           replicas=2 if backend == "postgres" else 1, workers=2, clients=6,
                           fault_every=6.0, seed=7, port=free_port)
    text = describe(outcome.violations, outcome.history, outcome.invariants)
    assert not outcome.violations, text
    assert outcome.faults >= 3 and outcome.calls >= 100, text  # it did something
    assert outcome.invariants >= 500, text
    assert outcome.history.exists()


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_checker_reports_the_invariant_a_mutation_breaks(mutation: str,
                                                             tmp_path: Path) -> None:
    """No faults: each mutation shows under the clients' contention alone (the deferred save
    of ``answer-before-commit`` loses races to other creates). ``store verify`` is left out:
    the short schedule runs it."""
    expected = MUTATIONS[mutation].breaks
    assert expected in INVARIANTS
    copy = mutated_copy(mutation, tmp_path / "code")
    outcome = run_schedule(tmp_path / "run", seconds=8.0, backend="sqlite", replicas=1,
                           workers=1, clients=6, agents=0, seed=11, pythonpath=copy,
                           port=free_port, faults=lambda _: [], verify=False)
    text = describe(outcome.violations, outcome.history, outcome.invariants)
    assert expected in {v.invariant for v in outcome.violations}, text
    assert f"BROKEN {expected}:" in text
