"""2,000 simulated agents against one real ``serve`` (its defaults), as bcd behaves.

The short form of ``benchmarks/fleet_sim.py`` (docs/performance.md, "A fleet on one
server"): 2,000 nodes joined in a fresh store, the server, and the agents over a few
seconds from several loopback addresses, each with its own certificate and key, answering
acceptance with a signed verdict and retrying with bcd's backoff. Every session stays up
and every node is adopted; how long that takes is the benchmark's business, not this
test's (the deadline only bounds a run that went wrong).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from better_compute.benchmarks.fleet_sim import GPUS, Plan, run_served

AGENTS = 2000


@pytest.mark.timeout(1200)  # adopt_deadline and the set-up: a loaded machine is slow, not wrong
def test_two_thousand_agents_are_adopted_and_no_session_drops(
        backend: str, env: dict[str, str], tmp_path: Path) -> None:
    plan = Plan(ramp=5.0, processes=1, hold=False, restart=False, adopt_deadline=900.0)
    result = run_served(env, AGENTS, tmp_path, plan, backend)
    assert result["adopted"] == AGENTS, result
    assert result["allocatableGpus"] == GPUS * AGENTS, result
    assert result["live"] == AGENTS and result["dropped"] == 0, result
    assert result["counts"]["acked"] == AGENTS and result["counts"]["nacked"] == 0, result
