"""Past one machine: three replicas behind HAProxy over a PostgreSQL that fails over.

The layout is ``scripts/ha up`` (docs/high-availability.md): etcd, a PostgreSQL primary and
its synchronous standby under Patroni, three ``serve`` replicas, HAProxy in front of the API
and of the gateway. Everything outside it knows only HAProxy's addresses: 16 callers through
the CLI's own client, and three GPU servers whose bcd joined and connects through HAProxy.
Real processes throughout; the faults are an operator's (``scripts/ha restart``) and a lost
host (``scripts/ha kill``: SIGKILL of Patroni and of every PostgreSQL process of the primary).

The agents heartbeat every second and are marked unreachable after the default 30 s without
one, so an agent left without a session through a rolling restart would be marked.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.cluster import Machine, Operator
from tests.ha import (
    Clients,
    Layout,
    assert_everything_acknowledged_is_there,
    ha_layout,
    join_machines,
    store_verify,
)
from tests.support import eventually

# An agent without a session for the default 30 s is marked unreachable: a hand-back that
# left one waiting that long would show. (10 s made a loaded machine's slow reconnects count:
# two marks in each of two suites run side by side at load 10-18, none alone.)
SETTINGS = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1"}
CLIENTS = 16
AGENTS = 3
UNAVAILABLE_AT_MOST = 30.0  # seconds of `unavailable` after the primary's host is lost
AGENTS_BACK_WITHIN = 60.0  # seconds from the loss to every agent connected


@dataclass
class Setup:
    layout: Layout
    operator: Operator
    pool: str
    machines: list[tuple[Machine, str]]

    @property
    def nodes(self) -> list[str]:
        return [node for _, node in self.machines]

    def sessions(self) -> dict[str, tuple[str, int]]:
        """Each node's session state and epoch, as the store has them."""
        return {n: (str(doc["session"]["state"]), int(doc["session"]["epoch"]))
                for n in self.nodes for doc in [self.operator.cli_json("nodes", "get", n)]}

    def unreachable_marks(self) -> int:
        return sum(self.operator.events(n).count("node.unreachable") for n in self.nodes)

    def clients(self) -> Clients:
        return Clients(self.operator.env, self.pool, CLIENTS)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    folder = tmp_path_factory.mktemp("ha")
    with ha_layout(SETTINGS) as layout:
        operator = Operator(layout.client_env())
        pool = operator.create_pool(folder)
        machines = join_machines(layout, operator, pool, folder, AGENTS)
        try:
            yield Setup(layout, operator, pool, machines)
        finally:
            for machine, _ in machines:
                machine.stop()


def _report(clients: Clients) -> str:
    failed = sorted(clients.failed(), key=lambda a: a.code == "unavailable")  # others first
    return (f"{len(clients.answers)} answers, {len(failed)} failed: "
            + "; ".join(f"{a.code} {a.method} {a.message[:300]}" for a in failed[:8]))


def test_a_rolling_restart_of_the_three_replicas_loses_no_call(setup: Setup) -> None:
    layout = setup.layout
    marks = setup.unreachable_marks()
    before = setup.sessions()
    clients = setup.clients()
    clients.start()
    try:
        eventually(lambda: clients.ok_after(0) >= 2 * CLIENTS, "the clients are calling")
        # Each replica in turn: SIGTERM (it drains: /ready 503 until HAProxy takes it out,
        # answers what it was asked, hands its agents back), then started and back in rotation.
        restarted = layout.ha("restart")
        assert restarted.count("restarted in") == 3, restarted
        ended = time.monotonic()
        eventually(lambda: clients.ok_after(ended) >= 2 * CLIENTS, "the clients call on")
    finally:
        clients.stop()
    assert clients.failed() == [], _report(clients)
    assert len(clients.created) >= CLIENTS
    # Each agent was handed back at least once and is connected again, each time through
    # HAProxy to a replica that was serving; none went long enough without a session to be
    # marked unreachable.
    sessions = setup.sessions()
    for node, (state, epoch) in sessions.items():
        assert state == "connected" and epoch > before[node][1], (node, before, sessions)
    assert setup.unreachable_marks() == marks
    assert all(part["ready"] for name, part in layout.status().items() if name.startswith("r"))
    for replica in ("r1", "r2", "r3"):
        log = layout.log(replica)
        assert "draining for 8s" in log and "Traceback" not in log, log[-3000:]
    assert_everything_acknowledged_is_there(layout, clients, setup.nodes)


def test_the_standby_takes_over_when_the_primarys_host_is_lost(setup: Setup) -> None:
    layout = setup.layout
    lost = layout.primary()
    standby = next(m for m in ("pg1", "pg2") if m != lost)
    assert layout.status()[standby]["role"] == "synchronous standby"
    try:
        _lose_the_primarys_host(setup, lost, standby)
    finally:  # whatever failed: the layout whole again for the module's other tests
        if not layout.status()[lost]["running"]:
            layout.ha("start", lost)
    # The lost host came back as the standby of the new primary (pg_rewind).
    assert layout.status()[lost]["role"] == "synchronous standby"


def _lose_the_primarys_host(setup: Setup, lost: str, standby: str) -> None:
    layout = setup.layout
    marks = setup.unreachable_marks()
    clients = setup.clients()
    clients.start()
    try:
        eventually(lambda: clients.ok_after(0) >= 2 * CLIENTS, "the clients are calling")
        layout.ha("kill", lost)  # Patroni and every PostgreSQL process: the host is gone
        killed = time.monotonic()
        # Writes answer `unavailable` meanwhile, then succeed against the promoted standby.
        eventually(lambda: clients.ok_after(killed + 1) >= 2 * CLIENTS,
                   "writes succeed again", timeout=90)
        back = time.monotonic()
        eventually(lambda: clients.ok_after(back) >= 2 * CLIENTS, "the clients call on")
        eventually(lambda: all(s == "connected" for s, _ in setup.sessions().values()),
                   "every agent is connected", timeout=max(1.0, killed + AGENTS_BACK_WITHIN
                                                           - time.monotonic()))
    finally:
        clients.stop()
    assert layout.primary() == standby
    failed = clients.failed()
    assert {a.code for a in failed} <= {"unavailable"}, _report(clients)
    assert failed, "the loss of the primary went unnoticed: was it the primary?"
    assert all(a.at > killed - 1 for a in failed), _report(clients)
    window = max(a.at for a in failed) - killed
    assert window < UNAVAILABLE_AT_MOST, f"unavailable for {window:.1f}s: {_report(clients)}"
    # The agents' sessions stayed up; whichever replica leads the controllers after the
    # failover counts nobody's silence during it (the gateways could not write heartbeats).
    assert setup.unreachable_marks() == marks
    assert_everything_acknowledged_is_there(layout, clients, setup.nodes)
    report = store_verify(layout)
    assert report["ok"], (report["problems"], report["projections"])


def test_scripts_ha_status_names_each_part_and_its_role(setup: Setup) -> None:
    parts = setup.layout.status()
    assert sorted(parts) == ["etcd", "haproxy", "pg1", "pg2", "r1", "r2", "r3"]
    assert all(part["running"] for part in parts.values()), parts
    assert sorted(parts[m]["role"] for m in ("pg1", "pg2")) == ["primary",
                                                                "synchronous standby"]
    replicas = [parts[r] for r in ("r1", "r2", "r3")]
    assert [r["role"] for r in replicas].count("controllers' leader") == 1, replicas
    assert all(r["haproxy"] == {"api": "UP", "gateway": "UP"} for r in replicas), replicas
    seen: list[dict[str, int]] = []

    def on_replicas() -> bool:
        seen.append({name: part["agent_sessions"] for name, part in setup.layout.status().items()
                     if name.startswith("r")})
        return sum(seen[-1].values()) == AGENTS

    try:
        # An agent whose session the failover ended may wait out bcd's backoff (30 s at
        # most) and a connect (15 s at most) before it is back.
        eventually(on_replicas, "every agent's session is on a replica",
                   timeout=AGENTS_BACK_WITHIN)
    except AssertionError as exc:
        states = [(status.stdout[-300:], status.stderr[-300:]) for status in
                  (machine.bcd("status") for machine, _ in setup.machines)]
        raise AssertionError(f"{exc}: {AGENTS} agents, sessions seen last {seen[-3:]}; "
                             f"bcd status: {states}") from None
    # What agents are told to connect to is HAProxy's gateway, never a replica's.
    state = setup.layout.state
    well_known = httpx.get(f"{state['api_url']}/api/compute/.well-known/better-compute",
                           verify=ssl.create_default_context(cafile=state["ca_file"]))
    assert well_known.json()["gatewayUrl"] == state["gateway_url"]
