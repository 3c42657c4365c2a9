"""POST /api/compute/rpc through the ASGI app: auth, params, stable error codes, no tracebacks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from better_compute.api.http.app import ServerState, build_app
from better_compute.api.runtime import Runtime
from tests.support import POLICY, open_runtime, quick_init

RPC = "/api/compute/rpc"


class Http:
    """Requests to the ASGI app in this process, with the state its lifespan would set."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.app = build_app(runtime)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            self.app.state.bc = ServerState(self.runtime, anyio.CapacityLimiter(4))
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
                return await c.request(method, path, **kw)

        return anyio.run(go)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)


@pytest.fixture
def client(env: dict[str, str]) -> Iterator[tuple[Http, str]]:
    rt = open_runtime(env)
    token = quick_init(rt)
    try:
        yield Http(rt), token
    finally:
        rt.close()


def call(http: Http, method: str, token: str | None = None, **params: Any) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    response = http.post(RPC, json=body, headers=headers)
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    assert answer["jsonrpc"] == "2.0" and answer["id"] == 7
    return answer


def error_code(answer: dict[str, Any]) -> tuple[int, str]:
    error = answer["error"]
    assert "Traceback" not in error["message"]
    return error["code"], error["data"]["code"]


def test_bearer_auth(client: tuple[Http, str]) -> None:
    http, token = client
    assert call(http, "system.whoami", token)["result"]["tenantId"] == "root"
    assert error_code(call(http, "system.whoami")) == (-32001, "unauthenticated")
    assert error_code(call(http, "system.whoami", "biam_nope")) == (-32001, "unauthenticated")
    response = http.post(RPC, json={"jsonrpc": "2.0", "id": 1, "method": "system.whoami"},
                         headers={"authorization": f"Basic {token}"})
    assert response.json()["error"]["data"]["code"] == "unauthenticated"
    # Public methods need no token.
    assert "methods" in call(http, "rpc.discover")["result"]


def test_params_by_name_in_camel_case(client: tuple[Http, str]) -> None:
    http, token = client
    site = call(http, "sites.create", token, kind="shared", region="eu-1", key="site-eu-1")
    pool = call(http, "pools.create", token, siteId=site["result"]["id"], gpuModel="H100",
                policy=POLICY, key="pool-eu-1-h100", **{"class": "metal-host"})
    assert pool["result"]["siteId"] == site["result"]["id"]
    code, stable = error_code(call(http, "pools.get", token, pool_id=pool["result"]["id"]))
    assert (code, stable) == (-32602, "invalid_input")


@pytest.mark.parametrize("params,needle", [
    ({"kind": "shared"}, "missing required field `region`"),
    ({"kind": "shared", "region": "eu-1", "colour": "red"}, "unknown field `colour`"),
    ({"kind": 1, "region": "eu-1"}, "Expected `str`, got `int` - at `$.kind`"),
])
def test_bad_params_name_the_field(client: tuple[Http, str], params: dict[str, Any],
                                   needle: str) -> None:
    http, token = client
    answer = call(http, "sites.create", token, **params)
    assert error_code(answer) == (-32602, "invalid_input")
    assert needle in answer["error"]["message"]
    assert call(http, "sites.list", token)["result"] == []


def test_stable_codes_for_domain_errors(client: tuple[Http, str]) -> None:
    http, token = client
    assert error_code(call(http, "pools.get", token, poolId="pool_" + "a" * 26)) == (
        -32004, "not_found")
    call(http, "sites.create", token, kind="shared", region="eu-1", key="k1")
    assert error_code(call(http, "sites.create", token, kind="shared", region="eu-2",
                           key="k1")) == (-32009, "conflict")
    site = call(http, "sites.create", token, kind="shared", region="eu-1", key="k1")
    answer = call(http, "pools.create", token, siteId=site["result"]["id"], gpuModel="H100",
                  policy={"expect": {"gpuCount": 8, "x": 1}}, **{"class": "metal-host"})
    assert error_code(answer) == (-32602, "invalid_policy")


def test_protocol_errors(client: tuple[Http, str]) -> None:
    http, token = client
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json"}
    answer = call(http, "sites.creat", token)
    assert error_code(answer) == (-32601, "method_not_found")
    assert "sites.create" in answer["error"]["message"]
    bad_json = http.post(RPC, content=b"{not json", headers=headers).json()
    assert bad_json["error"]["code"] == -32700
    assert (bad_json["jsonrpc"], bad_json["id"]) == ("2.0", None)  # required, null when unknown
    batch = http.post(RPC, content=json.dumps([{"jsonrpc": "2.0", "method": "rpc.discover"}]),
                      headers=headers).json()
    assert batch["error"]["code"] == -32600
    version = http.post(RPC, json={"jsonrpc": "1.0", "id": 1, "method": "rpc.discover"}).json()
    assert version["error"]["data"]["code"] == "invalid_request"
    huge = http.post(RPC, content=b" " * ((1 << 20) + 1), headers=headers)
    assert huge.status_code == 413 and huge.json()["error"]["code"] == -32600
    assert http.get(RPC).status_code == 405


def test_health_needs_no_token(client: tuple[Http, str]) -> None:
    http, _ = client
    assert http.get("/api/compute/health").json() == {"status": "ok"}
