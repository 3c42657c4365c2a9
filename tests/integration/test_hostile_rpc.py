"""POST /api/compute/rpc under hostile input, on both stores.

Every refusal is a JSON-RPC error with a stable code (never ``internal``,
never an HTTP 500 in text/plain) and leaves the event log where it was.
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from better_compute.api.http import http_limits
from tests.hostile import App, World, build_world, code_of, raw_post

MiB = 1 << 20


@contextlib.contextmanager
def _world(env: dict[str, str]) -> Iterator[World]:
    w = build_world(env)
    try:
        yield w
    finally:
        w.rt.close()


@pytest.fixture(scope="module")
def world(shared_env: dict[str, str]) -> Iterator[World]:
    """One world a module and backend: the tests that use it are refused or only read, and
    each refusal asserts that the event log did not move, so none sees another's traces."""
    with _world(shared_env) as w:
        yield w


@pytest.fixture(scope="module")
def app(world: World) -> Iterator[App]:
    with App(world.rt) as a:
        yield a


@pytest.fixture
def fresh_world(env: dict[str, str]) -> Iterator[World]:
    """A world of its own, for a test that writes or lists everything."""
    with _world(env) as w:
        yield w


@pytest.fixture
def fresh_app(fresh_world: World) -> Iterator[App]:
    with App(fresh_world.rt) as a:
        yield a


def refused(app: App, world: World, method: str, who: str, params: dict[str, Any],
            code: str = "invalid_input") -> dict[str, Any]:
    before = world.head()
    answer = app.call(method, world.tokens[who], params)
    assert code_of(answer) == code, (method, answer)
    assert "Traceback" not in answer["error"]["message"]
    assert world.head() == before, f"{method} changed the event log although it failed"
    return answer


# ------------------------------------------------------------------ item 3: bodies


def _forever(chunk: bytes) -> Iterator[bytes]:
    """64 MiB in chunks: far past the cap, finite so that a server reading it all ends."""
    return itertools.repeat(chunk, (64 * MiB) // len(chunk))


def test_a_content_length_over_1_mib_is_refused_before_reading(world: World) -> None:
    got = raw_post(world.rt, {"content-type": "application/json",
                              "content-length": str(300 * MiB)}, _forever(b" " * 65536))
    assert got.status == 413
    assert got.chunks_read == 0
    assert got.headers["connection"] == "close"  # the rest of the body is never received
    assert json.loads(got.body)["error"]["data"]["code"] == "invalid_request"


def test_a_streamed_body_is_cut_off_once_past_1_mib(world: World) -> None:
    before = world.head()
    got = raw_post(world.rt, {"content-type": "application/json",
                              "transfer-encoding": "chunked"}, _forever(b" " * 65536))
    assert got.status == 413
    assert got.chunks_read <= MiB // 65536 + 1, got.chunks_read
    assert got.headers["connection"] == "close"
    assert "1 MiB" in json.loads(got.body)["error"]["message"]
    assert world.head() == before


def test_a_lying_content_length_is_cut_off_too(world: World) -> None:
    got = raw_post(world.rt, {"content-type": "application/json", "content-length": "10"},
                   _forever(b" " * 65536))
    assert got.status == 413
    assert got.chunks_read <= MiB // 65536 + 1


# ------------------------------------------------------------- item 4: free text


HUGE = "x" * 1_000_000  # the 1 MB names that ballooned the store


@pytest.mark.parametrize(("method", "who", "params"), [
    ("sites.create", "root", {"kind": "shared", "region": "eu-1", "name": HUGE}),
    ("sites.create", "root", {"kind": "shared", "region": "eu-" + "1" * 100}),
    ("tenants.create", "root", {"tenantId": "globex", "name": HUGE}),
    ("tokens.create", "admin", {"role": "member", "name": HUGE}),
    ("tokens.create", "admin", {"role": "member", "name": "n" * 201}),
    ("pools.create", "root", {"siteId": "{site}", "class": "metal-host", "gpuModel": "H100",
                              "policy": {"expect": {"gpuCount": 8}}, "name": "p" * 201}),
    ("nodes.cordon", "root", {"nodeId": "{node}", "reason": "r" * 1001}),
    ("capacity.preview", "reader", {"poolId": "{pool}", "gpus": 1, "duration": "1h",
                                    "product": HUGE}),
])
def test_free_text_is_capped(app: App, world: World, method: str, who: str,
                             params: dict[str, Any]) -> None:
    params = {k: v.format(**world.ids) if isinstance(v, str) and v.startswith("{") else v
              for k, v in params.items()}
    answer = refused(app, world, method, who, params)
    assert "characters" in answer["error"]["message"]
    assert len(answer["error"]["message"]) < 1000  # never echoes the text


@pytest.mark.parametrize("text", ["acme\x00corp", "evil\u202etxt.exe", "tab\there", "bell\x07",
                                  "line\nbreak", "\u2066isolate\u2069"])
@pytest.mark.parametrize(("method", "who", "field", "params"), [
    ("sites.create", "root", "name", {"kind": "shared", "region": "eu-1"}),
    ("tenants.create", "root", "name", {"tenantId": "globex"}),
    ("tokens.create", "admin", "name", {"role": "member"}),
    ("nodes.cordon", "root", "reason", {"nodeId": "{node}"}),
])
def test_names_refuse_control_and_bidi_characters(app: App, world: World, text: str,
                                                  method: str, who: str, field: str,
                                                  params: dict[str, Any]) -> None:
    params = {k: v.format(**world.ids) for k, v in params.items()}
    answer = refused(app, world, method, who, {**params, field: text})
    assert "character" in answer["error"]["message"]


# ------------------------------------------------------- item 6: numbers, nesting


@pytest.mark.parametrize(("method", "params"), [
    ("reservations.create", {"poolId": "{pool}", "gpus": 1, "duration": "999999999999d"}),
    ("reservations.create", {"poolId": "{pool}", "gpus": 1, "duration": "1h",
                             "start": "+3000000d"}),
    ("reservations.create", {"poolId": "{pool}", "gpus": 1, "duration": "1h",
                             "start": "9999-12-31T00:00:00Z"}),
    ("capacity.preview", {"poolId": "{pool}", "gpus": 1, "duration": "1h",
                          "start": "9999-12-31T23:59:59Z"}),
    ("reservations.extend", {"reservationId": "{rsv}", "by": "999999999999d"}),
    ("reservations.create", {"poolId": "{pool}", "gpus": 10**30, "duration": "1h"}),
])
def test_huge_durations_and_numbers_are_input_errors(app: App, world: World, method: str,
                                                     params: dict[str, Any]) -> None:
    params = {k: v.format(**world.ids) if isinstance(v, str) else v for k, v in params.items()}
    refused(app, world, method, "member", params)


def test_a_huge_join_token_ttl_is_an_input_error(app: App, world: World) -> None:
    refused(app, world, "joinTokens.create", "root",
            {"poolId": world.ids["pool"], "ttl": "999999999999d"})


@pytest.mark.parametrize("body", [
    b"[" * 1000,
    b'{"jsonrpc": "2.0", "id": 1, "method": "system.whoami", "params": ' + b"[" * 100_000,
    b'{"jsonrpc": "2.0", "id": 1, "method": "sites.create", "params": {"kind": '
    + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}",
])
def test_deeply_nested_json_is_a_parse_error_not_a_500(app: App, world: World,
                                                       body: bytes) -> None:
    before = world.head()
    for token in (None, world.tokens["root"]):
        response = app.post(body, token)
        assert response.status_code == 200, response.text[:300]
        assert response.headers["content-type"].startswith("application/json")
        error = response.json()["error"]
        assert error["code"] in (-32700, -32600, -32602), error
        assert error["data"]["code"] in ("invalid_request", "invalid_input")
    assert world.head() == before


@pytest.mark.parametrize("params", [
    {"nested": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]},
])
def test_deep_params_are_refused(app: App, world: World, params: dict[str, Any]) -> None:
    policy = {"expect": {"gpuCount": 8}, **params}
    refused(app, world, "pools.create", "root",
            {"siteId": world.ids["site"], "class": "metal-host", "gpuModel": "H100",
             "policy": policy}, code="invalid_input")


# ------------------------------------------------- item 2: calls of one token at once


def test_a_token_with_too_many_calls_is_rate_limited_and_others_are_not(
        fresh_app: App, fresh_world: World) -> None:
    app, world = fresh_app, fresh_world  # the admission gates are the app's: its own
    admission = app.app.state.bc.admission
    key = http_limits.caller_key(None, world.tokens["reader"])
    release = app.portal.call(anyio.Event)
    full = admission.per_caller + admission.queue

    async def hold() -> None:
        async with admission.slot(key):
            await release.wait()

    for _ in range(full):  # the token's running and waiting calls, all taken
        app.portal.start_task_soon(hold)
    app.portal.call(_until, lambda: admission._gates[key].users == full)
    body = json.dumps({"jsonrpc": "2.0", "id": 42, "method": "system.whoami"}).encode()
    refused = app.post(body, world.tokens["reader"])
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["id"] == 42
    assert refused.json()["error"]["data"] == {  # the bound is each worker process's
        "code": "rate_limited", "running": admission.per_caller, "waiting": admission.queue,
        "per": "worker"}
    assert "retry" in refused.json()["error"]["message"]
    assert app.call("system.whoami", world.tokens["root"])["result"]["tenantId"] == "root"
    app.portal.call(release.set)
    app.portal.call(_until, lambda: key not in admission._gates)
    assert app.call("system.whoami", world.tokens["reader"])["result"]["role"] == "read-only"


def test_a_tenants_tokens_together_are_rate_limited_and_other_tenants_are_not(
        fresh_app: App, fresh_world: World) -> None:
    """Each token has its own bound, but a tenant admin can mint many: the calls of one
    tenant's tokens together have a bound too, once the server knows the token's tenant
    (learnt when one of its calls authenticates)."""
    app, world = fresh_app, fresh_world
    admission = app.app.state.bc.admission
    reader = world.tokens["reader"]  # acme's
    assert app.call("system.whoami", reader)["result"]["tenantId"] == "acme"  # learnt
    release = app.portal.call(anyio.Event)
    full = admission.per_tenant + admission.tenant_queue

    async def hold(n: int) -> None:  # calls of other tokens of acme, one each
        async with admission.slot(f"token:other-{n}", "acme"):
            await release.wait()

    for n in range(full):
        app.portal.start_task_soon(hold, n)
    app.portal.call(_until, lambda: admission._gates["tenant:acme"].users == full)
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "system.whoami"}).encode()
    refused = app.post(body, reader)
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["data"] == {
        "code": "rate_limited", "running": admission.per_tenant,
        "waiting": admission.tenant_queue, "per": "worker", "of": "tenant"}
    assert "tenant acme already has" in refused.json()["error"]["message"]
    assert app.call("system.whoami", world.tokens["root"])["result"]["tenantId"] == "root"
    app.portal.call(release.set)
    app.portal.call(_until, lambda: "tenant:acme" not in admission._gates)
    assert app.call("system.whoami", reader)["result"]["role"] == "read-only"


async def _until(condition: Any) -> None:
    with anyio.fail_after(20):
        while not condition():
            await anyio.sleep(0.01)


# --------------------------------------------------------------- item 9: smaller


@pytest.mark.parametrize(("method", "params"), [
    ("tenants.create", {"tenantId": "acme\n"}),
    ("tenants.get", {"tenantId": "acme\n"}),
    ("sites.create", {"kind": "shared", "region": "eu-1", "key": "site-a\n"}),
    ("sites.create", {"kind": "shared", "region": "eu-1\n"}),
    ("pools.get", {"poolId": "{pool}\n"}),
    ("joinTokens.create", {"poolId": "{pool}", "ttl": "2h\n"}),
    ("joinTokens.create", {"poolId": "{pool}", "ttl": "2h", "expectSerial": "SN-1\n"}),
])
def test_trailing_newlines_are_refused(app: App, world: World, method: str,
                                       params: dict[str, Any]) -> None:
    params = {k: v.format(**world.ids) for k, v in params.items()}
    refused(app, world, method, "root", params)


def test_a_tenant_with_a_trailing_newline_is_not_a_second_tenant(fresh_app: App,
                                                                 fresh_world: World) -> None:
    app, world = fresh_app, fresh_world  # lists every tenant: a store of its own
    refused(app, world, "tenants.create", "root", {"tenantId": "acme\n", "name": "Acme"})
    listed = app.call("tenants.list", world.tokens["root"])["result"]
    assert sorted(t["id"] for t in listed) == ["acme", "root"]


@pytest.mark.parametrize("quota", [{"gpu": 10**30}, {"gpu": 10**7}, {"gpu": 2**63}])
def test_quotas_have_an_upper_bound(app: App, world: World, quota: dict[str, int]) -> None:
    answer = refused(app, world, "pools.offer", "root",
                     {"poolId": world.ids["pool"], "toTenantId": "acme", "quota": quota})
    assert "gpu" in answer["error"]["message"]


def test_a_notification_gets_no_answer(app: App, world: World) -> None:
    body = json.dumps({"jsonrpc": "2.0", "method": "system.whoami"}).encode()
    response = app.post(body, world.tokens["root"])
    assert response.status_code == 204
    assert response.content == b""
    failing = json.dumps({"jsonrpc": "2.0", "method": "sites.create",
                          "params": {"kind": "nope", "region": "eu-1"}}).encode()
    response = app.post(failing, world.tokens["root"])
    assert (response.status_code, response.content) == (204, b"")
    # An explicit null id is a request (discouraged by the spec), and is answered.
    answered = app.post(json.dumps({"jsonrpc": "2.0", "id": None,
                                    "method": "system.whoami"}).encode(), world.tokens["root"])
    assert answered.status_code == 200 and answered.json()["id"] is None


def test_a_notification_still_runs(fresh_app: App, fresh_world: World) -> None:
    app, world = fresh_app, fresh_world  # it writes: a store of its own
    before = world.head()
    body = json.dumps({"jsonrpc": "2.0", "method": "sites.create",
                       "params": {"kind": "shared", "region": "eu-9"}}).encode()
    assert app.post(body, world.tokens["root"]).status_code == 204
    assert world.head() == before + 1


@pytest.mark.parametrize("types", ["[", "node.[", "a]b[", "*[!"])
def test_an_unclosed_bracket_is_an_invalid_glob(app: App, world: World, types: str) -> None:
    answer = refused(app, world, "events.list", "root", {"types": types})
    assert "glob" in answer["error"]["message"]


@pytest.mark.parametrize("tenant", ["ACME", "acme\n", "a" * 41, "", "../root"])
def test_a_malformed_tenant_id_is_invalid_input(app: App, world: World, tenant: str) -> None:
    for method in ("tokens.list", "nodes.list", "joinTokens.list", "reservations.list"):
        answer = app.call(method, world.tokens["root"], {"tenantId": tenant})
        if tenant == "":
            continue  # an empty tenantId means "the caller's tenant"
        assert code_of(answer) == "invalid_input", (method, tenant, answer)


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_the_content_type_must_be_json(app: App, world: World,
                                       content_type: str | None) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "system.whoami"}).encode()
    response = app.post(body, world.tokens["root"], content_type=content_type)
    assert response.status_code == 415
    error = response.json()["error"]
    assert error["data"]["code"] == "invalid_request"
    assert "application/json" in error["message"]


def test_json_with_a_charset_is_accepted(app: App, world: World) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "system.whoami"}).encode()
    response = app.post(body, world.tokens["root"],
                        content_type="application/json; charset=utf-8")
    assert response.status_code == 200 and response.json()["result"]["tenantId"] == "root"
