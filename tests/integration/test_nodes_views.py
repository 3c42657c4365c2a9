"""What `nodes list` and `nodes get` show of a node's session and retirement, on both backends.

LAST SEEN is the newest heartbeat the gateway recorded (api/store/node_presence.py), not the
time the session opened; removed nodes are left out unless asked for.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from better_compute.api.store.node_presence import Presence
from better_compute.benchmarks.fleet import build_node
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.base import iso
from tests.fleet import make_pool
from tests.support import cli_inprocess, initialize, open_runtime


def test_last_seen_is_the_newest_heartbeat_of_the_current_session(env: dict[str, str]) -> None:
    initialize(env)
    env = {**env, "BETTER_COMPUTE_TENANT": "root"}
    now = datetime.now(UTC)
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service)
        node = build_node(pool, hostname="gpu-sn-7701")
        epoch = node.connect(now - timedelta(minutes=5), "0.1.0")  # its session opened 5m ago
        rt.service.store.save(node, actor="local")
        Presence(rt.service.sql).record([(str(node.id), epoch, now)])  # and it beat just now
    finally:
        rt.close()
    code, out, err = cli_inprocess(["nodes", "get", "gpu-sn-7701", "--query", "session"], env)
    session = json.loads(out)
    assert code == 0, err
    assert session["since"] == iso(now - timedelta(minutes=5))
    assert datetime.fromisoformat(session["lastSeen"].replace("Z", "+00:00")) == now
    code, out, err = cli_inprocess(["nodes", "list", "-o", "wide"], env)
    header, row = out.splitlines()
    seen = row[header.index("LAST SEEN"):].split()[0]
    assert seen.endswith("s") and not seen.endswith("m"), out  # seconds ago, not "5m"
    code, out, _ = cli_inprocess(["nodes", "list", "--query", "[0].session.lastSeen"], env)
    assert out.strip() == session["lastSeen"]


def test_a_heartbeat_of_an_earlier_session_is_not_the_last_seen(env: dict[str, str]) -> None:
    initialize(env)
    now = datetime.now(UTC)
    rt = open_runtime(env)
    try:
        node = build_node(make_pool(rt.service))
        node.connect(now - timedelta(minutes=10), None)
        epoch = node.connect(now - timedelta(minutes=5), None)
        rt.service.store.save(node, actor="local")
        Presence(rt.service.sql).record([(str(node.id), epoch - 1, now)])
        shown = rt.services.nodes.get(LOCAL_OPERATOR, node.public_id)["session"]["lastSeen"]
    finally:
        rt.close()
    assert shown == iso(now - timedelta(minutes=5))


def test_removed_nodes_are_hidden_unless_asked_for(env: dict[str, str]) -> None:
    initialize(env)
    env = {**env, "BETTER_COMPUTE_TENANT": "root"}
    rt = open_runtime(env)
    try:
        pool = make_pool(rt.service)
        kept, gone = build_node(pool), build_node(pool)
        rt.service.store.save(kept, gone, actor="local")
        rt.services.nodes.remove(LOCAL_OPERATOR, gone.public_id, "retired", force=False)
    finally:
        rt.close()
    code, out, err = cli_inprocess(["nodes", "list", "--query", "[].id"], env)
    assert (code, json.loads(out)) == (0, [kept.public_id]), err
    code, out, err = cli_inprocess(["nodes", "list", "--include-removed", "--query",
                                    "[].[id, provisionState]"], env)
    assert json.loads(out) == [[kept.public_id, "adopted"], [gone.public_id, "removed"]], err
    code, out, _ = cli_inprocess(["nodes", "get", gone.public_id, "--query", "provisionState"],
                                 env)
    assert out.strip() == "removed"  # still there by its id
