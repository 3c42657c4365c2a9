"""A captured ``nodes.join`` body posted again is refused.

The sealed request carries a nonce and the CSR of a key generated on the
machine. A join token refuses a request whose nonce or node key it has seen: otherwise a
token with uses left would accept the same captured body again and again, making one node
per post with the same key pin and hardware key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR
from tests.hostile import App, code_of
from tests.join_client import JoinAttempt, hardware
from tests.support import POLICY, initialize, open_runtime


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[Runtime]:
    initialize(env)  # the real init: the master key the join unseals the PKI bundle with
    rt = open_runtime(env)
    try:
        yield rt
    finally:
        rt.close()


def _mint(rt: Runtime, uses: int) -> tuple[str, str]:
    service = rt.service
    site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, None)["id"]
    pool = service.pools_create(LOCAL_OPERATOR, site, "metal-host", "H100", POLICY, None,
                                None)["id"]
    doc = rt.services.join.create(LOCAL_OPERATOR, pool, "2h", uses, None, None, None, None)
    return doc["id"], doc["token"]


def _nodes(rt: Runtime) -> list[str]:
    return [n["id"] for n in rt.service.listing("node")]


def test_a_replayed_join_body_is_refused(runtime: Runtime) -> None:
    token_id, secret = _mint(runtime, uses=3)
    public = runtime.service.pki().public
    attempt = JoinAttempt(secret, hardware(serial="SN-7701"))
    captured = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "nodes.join",
                           "params": attempt.params(public)}).encode()
    with App(runtime) as app:
        first = app.post(captured).json()
        assert "result" in first, first
        head = int(runtime.store.recorder.max_notification_id() or 0)
        for _ in range(2):
            again = app.post(captured).json()
            assert code_of(again) == "conflict", again
            assert "already" in again["error"]["message"]
            assert int(runtime.store.recorder.max_notification_id() or 0) == head
        assert len(_nodes(runtime)) == 1
        token = runtime.services.join.get(LOCAL_OPERATOR, token_id)
        assert (token["uses"], token["state"]) == (1, "active")  # the app's lifespan closes
        # the runtime when it ends, so everything is read before that


def test_the_same_nonce_or_the_same_node_key_is_refused(runtime: Runtime) -> None:
    _, secret = _mint(runtime, uses=5)
    joins = runtime.services.join
    public = runtime.service.pki().public
    first = JoinAttempt(secret, hardware(serial="SN-1"))
    joins.join(first.params(public)["sealed"])
    same_nonce = JoinAttempt(secret, hardware(serial="SN-2"), nonce=first.nonce)
    same_key = JoinAttempt(secret, hardware(serial="SN-3"), key=first.key)
    for attempt in (same_nonce, same_key):
        with pytest.raises(Exception) as err:
            joins.join(attempt.params(public)["sealed"])
        assert getattr(err.value, "code", None) == "conflict"
    # A fresh request (new key, new nonce) still joins while the token has uses left.
    joins.join(JoinAttempt(secret, hardware(serial="SN-4")).params(public)["sealed"])
    assert len(_nodes(runtime)) == 2
