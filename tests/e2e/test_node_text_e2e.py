"""What a node says reaches a person's terminal as text, never as terminal commands
(docs/security.md, "Text from nodes and tenants"), with real processes.

A real ``serve --gateway-listen`` and a node made by hand (a valid node certificate) whose
Hello carries a bcd version of 300,000 characters full of terminal escapes (retitle, clear
screen, red), a right-to-left override and rich markup: the gateway refuses it at the wire's
bound and records nothing. A short one is taken, and ``better-compute nodes get`` and
``nodes events``, run as processes printing tables, show it with every control and bidi
character escaped and the markup as plain brackets. The hostname and a GPU name given at join
the same way.
"""

from __future__ import annotations

from pathlib import Path

import anyio

from better_compute.api.wire import gateway as wire
from tests.cluster import running_cluster
from tests.handmade_node import join_by_hand
from tests.join_client import hardware
from tests.support import CLI, eventually, run

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "2", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}
HOSTILE = "\x1b]0;TITLE\x07\x1b[2J\x1b[31m\u202e[red]x[/red]\u2066\x9b"
RAW = ("\x1b", "\x07", "\u202e", "\u2066", "\x9b")


def test_hostile_text_from_a_node_is_bounded_and_shown_escaped(env: dict[str, str],
                                                                tmp_path: Path) -> None:
    with running_cluster(env, tmp_path, FAST) as c:
        facts = hardware(serial="SN-6666", gpus=2)
        facts.hostname = "gpu" + HOSTILE
        facts.gpus[0].name = "NVIDIA H100 " + HOSTILE
        client, node = join_by_hand(c, "SN-6666", tmp_path, facts)

        async def hello(version: str) -> wire.ToNode:
            try:
                return await client.connect(bcd_version=version)
            finally:
                await client.close()

        refused = anyio.run(hello, HOSTILE * 12_000)  # 300,000 characters and more
        assert isinstance(refused, wire.Refused) and refused.code == "bad_hello", refused
        assert "bcdVersion" in refused.message and len(refused.message) < 1000
        assert c.events(node) == ["node.joined"]

        assert isinstance(anyio.run(hello, "1.0 " + HOSTILE), wire.Welcome)
        eventually(lambda: "node.connected" in c.events(node), "the session is recorded")
        shown = run([CLI, "nodes", "get", node, "-o", "table"], c.env)
        assert shown.returncode == 0, shown.stderr
        for raw in RAW:
            assert raw not in shown.stdout, (raw, shown.stdout)
        assert "1.0 \\x1b]0;TITLE\\x07\\x1b[2J\\x1b[31m\\u202e[red]x[/red]\\u2066\\x9b" \
            in shown.stdout
        assert "gpu\\x1b]0;TITLE" in shown.stdout  # the hostname given at join
        events = run([CLI, "nodes", "events", node, "-o", "table"], c.env)
        assert events.returncode == 0 and "node.connected" in events.stdout, events.stderr
        for raw in RAW:
            assert raw not in events.stdout, (raw, events.stdout)
        bare = run([CLI, "nodes", "get", node, "--query", "bcdVersion"], c.env)
        assert bare.stdout == "1.0 " + HOSTILE + "\n"  # piped: the value as it is, for scripts
