"""The high-availability layout for end-to-end tests: ``scripts/ha`` as an operator runs it.

``ha_layout`` brings up what docs/high-availability.md describes (etcd, two PostgreSQL
members under Patroni, three ``serve`` replicas, HAProxy) in a folder of its own with ports
chosen free, with ``scripts/ha up``, and kills it after. ``Layout`` drives it through the same
script (``status --json``, ``restart``, ``kill``, ``start``): the tests exercise what ships.
``Clients`` call the API through HAProxy with the CLI's own HTTP client, each creating a 1-GPU
reservation with a key and releasing it, over and over, retrying a failed call with the same
key (what a user does with ``--key``), and keep every answer. Both are benchmarks/ha.py's,
which runs the same faults and more as a benchmark.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from better_compute.benchmarks.ha import Answer, Clients, Layout, check_acknowledged
from tests.cluster import Machine, Operator
from tests.support import cli_inprocess, eventually

__all__ = ["Answer", "Clients", "Layout", "assert_everything_acknowledged_is_there",
           "ha_layout", "join_machines", "store_verify"]


@contextlib.contextmanager
def ha_layout(settings: dict[str, str]) -> Iterator[Layout]:
    """``scripts/ha up --fast`` with these replica settings in a folder under /tmp (short
    paths for the sockets; reachable by ``nobody``, who runs PostgreSQL when the tests run
    as root); after, every part killed (nothing is kept, so nothing needs a clean stop) and
    the folder gone."""
    folder = Path(tempfile.mkdtemp(prefix="bc-ha.", dir="/tmp"))
    folder.chmod(0o711)
    layout = Layout(folder, {})
    try:
        layout = Layout.up(folder, settings)
        yield layout
    finally:
        layout.kill_all()
        shutil.rmtree(folder, ignore_errors=True)


def join_machines(layout: Layout, operator: Operator, pool: str, folder: Path,
                  count: int) -> list[tuple[Machine, str]]:
    """``count`` GPU servers joined through HAProxy, their bcd running and adopted."""
    machines = []
    for n in range(count):
        machine = Machine(folder / f"SN-77{n:02d}", serial=f"SN-77{n:02d}")
        node = machine.join(operator, layout.state["api_url"], pool)
        machine.start_agent(epoch=1, drain=True)  # up for the whole module
        machines.append((machine, node))
    for _, node in machines:
        eventually(lambda n=node: operator.provision_state(n) == "adopted",  # type: ignore[misc]
                   f"{node} is adopted", timeout=90)
    return machines


def store_verify(layout: Layout) -> dict[str, Any]:
    code, out, err = cli_inprocess(["store", "verify", "--output", "json"], layout.store_env())
    assert code == 0, (out[-3000:], err[-3000:])
    report: dict[str, Any] = json.loads(out)
    return report


def assert_everything_acknowledged_is_there(layout: Layout, clients: Clients,
                                            nodes: Sequence[str]) -> None:
    """Every reservation a client was told was created is in the store, released when its
    release was answered, and no GPU of a node is booked twice at once."""
    problems = check_acknowledged(layout, clients, list(nodes))
    assert not problems, problems[:10]
