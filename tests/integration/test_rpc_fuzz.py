"""Property-based fuzzing of EVERY JSON-RPC method through the real HTTP app.

For each registered method, hypothesis draws params from the method's params
schema (tests/fuzzing.py: plausible values, the ids of a populated store, and
hostile strings, numbers, nesting and sizes) and a caller of each role (root
administrator, tenant admin, member, read-only, no token). Every answer must
be a JSON-RPC answer (never HTTP 500, never text/plain), never ``internal``,
with a stable error code, and a refused call must leave the event log where
it was.

The normal suite draws ``BC_FUZZ_EXAMPLES`` examples per method (default 8,
a few seconds per store); set it higher for a longer hunt, e.g.
``BC_FUZZ_EXAMPLES=500 scripts/test -k fuzz``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from better_compute.api.http import rpc
from better_compute.domain.errors import error_codes
from tests.fuzzing import params_for
from tests.hostile import ROLES, App, World, build_world

EXAMPLES = int(os.environ.get("BC_FUZZ_EXAMPLES", "8"))
PROTOCOL_CODES = {"invalid_request", "method_not_found"}


STABLE = error_codes() | PROTOCOL_CODES


@pytest.fixture
def fuzzed(env: dict[str, str]) -> Iterator[tuple[World, App]]:
    world = build_world(env)
    try:
        with App(world.rt) as app:
            yield world, app
    finally:
        world.rt.close()


def _check_one(world: World, app: App, method: str, role: str | None, params: Any) -> str:
    before = world.head()
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    response = app.post(body.encode(), world.tokens[role] if role else None)
    assert response.status_code in (200, 413, 429), (method, role, response.status_code,
                                                     response.text[:300])
    assert response.headers["content-type"].startswith("application/json")
    answer: dict[str, Any] = response.json()
    if "error" not in answer:
        return "ok"
    code = answer["error"]["data"]["code"]
    assert code != "internal", (method, role, params, answer)
    assert code in STABLE, (method, code)
    assert "Traceback" not in answer["error"]["message"]
    assert world.head() == before, f"{method} refused with {code} but wrote events"
    return str(code)


def _fuzz(world: World, app: App, method: str, ids: dict[str, str]) -> set[str]:
    seen: set[str] = set()

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(role=st.sampled_from(["root", "root", *ROLES, None]), params=params_for(method, ids))
    def run(role: str | None, params: Any) -> None:
        seen.add(_check_one(world, app, method, role, params))

    run()
    return seen


def test_fuzz_every_method(fuzzed: tuple[World, App]) -> None:
    """One populated store per backend, every method in turn (a store per method would
    spend the test's time building stores)."""
    world, app = fuzzed
    ids = dict(world.ids)
    outcomes: dict[str, set[str]] = {}
    for method in sorted(rpc.METHODS):
        outcomes[method] = _fuzz(world, app, method, ids)
    assert set(outcomes) == set(rpc.METHODS)
    assert all(outcomes.values())  # every method was called
