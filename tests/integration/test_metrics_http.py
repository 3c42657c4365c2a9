"""/metrics and request records through the ASGI app, on both backends.

A store that fails under a request and under a scrape (its read model tables dropped: a
real database error, not a stand-in) is counted in ``better_compute_store_errors_total``;
the scrape still answers, with ``better_compute_store_up 0``. Requests carry an
``X-Request-Id``: the caller's when it is a sane one, else a fresh one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from better_compute.api.http.app import ServerState, build_app
from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR
from tests.support import open_runtime, quick_init

ROOT = Path(__file__).resolve().parents[2]


class Http:
    """The ASGI app in this process, with the state its lifespan would set."""

    def __init__(self, runtime: Runtime) -> None:
        self.app = build_app(runtime)
        self.app.state.bc = ServerState(runtime, anyio.CapacityLimiter(4))
        self.app.state.metrics.bind(self.app.state.bc)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
                return await c.request(method, path, **kw)

        return anyio.run(go)


@pytest.fixture
def served(env: dict[str, str]) -> Iterator[tuple[Http, Runtime, str]]:
    rt = open_runtime(env)
    token = quick_init(rt)
    try:
        yield Http(rt), rt, token
    finally:
        rt.close()


def _rpc(http: Http, token: str, method: str, headers: dict[str, str] | None = None
         ) -> httpx.Response:
    return http.request("POST", "/api/compute/rpc", json={
        "jsonrpc": "2.0", "id": 1, "method": method, "params": {}},
        headers={"authorization": f"Bearer {token}", **(headers or {})})


def _samples(http: Http, token: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = http.request("GET", "/metrics", headers={"authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(answer.text) for s in f.samples}


def test_store_errors_are_counted_and_the_scrape_still_answers(
        served: tuple[Http, Runtime, str]) -> None:
    http, rt, token = served
    assert _samples(http, token)[("better_compute_store_up", ())] == 1
    sql = rt.projections.sql
    with sql.transaction(commit=True) as cursor:
        cursor.execute("DROP TABLE bc_rsv")
        cursor.execute("DROP TABLE bc_rsv_count")
    failed = _rpc(http, token, "reservations.list").json()
    assert failed["error"]["data"]["code"] in ("internal", "unavailable")
    samples = _samples(http, token)
    assert samples[("better_compute_store_up", ())] == 0
    assert samples[("better_compute_store_errors_total", (("where", "rpc"),))] == 1
    assert samples[("better_compute_store_errors_total", (("where", "scrape"),))] == 1
    code = failed["error"]["data"]["code"]
    assert samples[("better_compute_rpc_requests_total",
                    (("code", code), ("method", "reservations.list")))] == 1
    assert ("better_compute_pool_gpus", ()) not in samples  # nothing read, nothing invented


def test_each_request_has_an_id(served: tuple[Http, Runtime, str]) -> None:
    http, _, token = served
    given = _rpc(http, token, "system.whoami", {"x-request-id": "lb-7f3a.2"})
    assert given.headers["x-request-id"] == "lb-7f3a.2"
    for bad in ("", "x" * 65, "no spaces"):
        fresh = _rpc(http, token, "system.whoami", {"x-request-id": bad})
        assert len(fresh.headers["x-request-id"]) == 16 and fresh.headers["x-request-id"] != bad
    unknown = _rpc(http, token, "no.such.method")
    assert unknown.json()["error"]["data"]["code"] == "method_not_found"
    samples = _samples(http, token)
    assert samples[("better_compute_rpc_requests_total",
                    (("code", "method_not_found"), ("method", "unknown")))] == 1
    assert samples[("better_compute_rpc_requests_total",
                    (("code", "ok"), ("method", "system.whoami")))] == 4


def test_metrics_is_for_root_tenant_tokens(served: tuple[Http, Runtime, str]) -> None:
    http, rt, _ = served
    rt.service.tenants_create(LOCAL_OPERATOR, "acme", None)
    viewer = rt.service.tokens_create(LOCAL_OPERATOR, "root", "read-only", None)["token"]
    acme = rt.service.tokens_create(LOCAL_OPERATOR, "acme", "admin", None)["token"]
    assert http.request("GET", "/metrics", headers={
        "authorization": f"Bearer {viewer}"}).status_code == 200
    refused = http.request("GET", "/metrics", headers={"authorization": f"Bearer {acme}"})
    assert refused.status_code == 403 and "root tenant" in refused.json()["error"]["message"]
    assert http.request("GET", "/metrics").status_code == 401


def test_every_metric_is_documented(served: tuple[Http, Runtime, str]) -> None:
    http, _, token = served
    _rpc(http, token, "system.whoami")
    documented = (ROOT / "docs" / "metrics.md").read_text()
    names = {re.sub(r"_(bucket|count|sum)$", "", name) for name, _ in _samples(http, token)}
    missing = sorted(n for n in names if not n.startswith("process_") and f"`{n}`" not in
                     documented)
    assert not missing, f"metrics not in docs/metrics.md: {missing}"


def test_pools_and_nodes_as_capacity_shows_them(served: tuple[Http, Runtime, str]) -> None:
    from better_compute.benchmarks.fleet import add_nodes, make_pool

    http, rt, token = served
    pool, empty = make_pool(rt.service), make_pool(rt.service, key="pool-empty")
    adopted = add_nodes(rt.service, pool, 2)
    [adopting] = add_nodes(rt.service, pool, 1, adopted=False)
    samples = _samples(http, token)
    for each in (pool, empty):
        capacity = rt.services.nodes.capacity(LOCAL_OPERATOR, each)
        for name, resource in (("better_compute_pool_gpus", "gpu"),
                               ("better_compute_pool_cpus", "cpu"),
                               ("better_compute_pool_memory_gibibytes", "memory")):
            for state, expected in capacity["resources"][resource].items():
                if state != "unit":
                    assert samples[(name, (("pool", each), ("state", state)))] == expected
        for state, expected in capacity["nodes"].items():
            assert samples[("better_compute_pool_nodes", (("pool", each), ("state", state)))] \
                == expected
    not_ready = sorted((dict(labels)["node"], dict(labels)["reason"])
                       for name, labels in samples if name == "better_compute_node_not_ready")
    assert not_ready == sorted([(adopting, "adopting"), (adopting, "never"),
                                *((node, "never") for node in adopted)])
