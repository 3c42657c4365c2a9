"""GET /api/compute/events/watch against a real `better-compute serve`, on both backends."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx

from tests.support import cli_inprocess, initialize, open_runtime, serve
from tests.watching import Reader, log_sequences, watch_env, write_sites


def _ca(env: dict[str, str]) -> Path:
    return Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"


def test_since_is_exclusive_globs_filter_and_live_events_follow(env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    try:
        first = write_sites(runtime, 3)
        with serve(watch_env(env)) as server:
            reader = Reader(server, token, _ca(env), since=first[0], types="site.*,nothing.*")
            assert reader.status == 200
            hello = reader.get()
            assert hello == {"heartbeat": True, "head": first[0]}
            got = reader.events(2)
            assert [e["sequence"] for e in got] == first[1:]
            assert {e["type"] for e in got} == {"site.created"}
            assert set(got[0]) == {"sequence", "type", "time", "tenantId", "subject", "actor",
                                   "data"}
            assert got[0]["subject"].startswith("site_") and got[0]["tenantId"] == "root"
            # A live event arrives as it commits; an event of another type never does.
            assert cli_inprocess(["tenants", "create", "acme"], env)[0] == 0
            live = write_sites(runtime, 1, region="eu-9")
            (event,) = reader.events(1)
            assert event["sequence"] == live[0] and event["data"]["region"] == "eu-9"
            # Idle: heartbeats carry the head, past the tenant.created this reader filtered out.
            beat = reader.until(lambda line: "heartbeat" in line)[-1]
            assert beat == {"heartbeat": True, "head": log_sequences(runtime)[-1]}
            reader.close()
    finally:
        runtime.close()


def test_two_tenants_each_see_only_their_own_events(env: dict[str, str]) -> None:
    token = initialize(env)
    for tenant in ("acme", "beta"):
        assert cli_inprocess(["tenants", "create", tenant], env)[0] == 0
    tokens = {}
    for tenant in ("acme", "beta"):
        code, out, err = cli_inprocess(["tokens", "create", "--tenant", tenant, "--role", "admin",
                                        "--query", "token"], env)
        assert code == 0, err
        tokens[tenant] = out.strip()
    with serve(watch_env(env)) as server:
        readers = {t: Reader(server, tokens[t], _ca(env), since=0) for t in tokens}
        root = Reader(server, token, _ca(env), since=0)
        # Each tenant admin mints one more token of its own tenant, over HTTP.
        for tenant, secret in tokens.items():
            with httpx.Client(verify=ssl.create_default_context(cafile=str(_ca(env)))) as http:
                answer = http.post(f"{server.url}/api/compute/rpc",
                                   headers={"authorization": f"Bearer {secret}"},
                                   json={"jsonrpc": "2.0", "id": 1, "method": "tokens.create",
                                         "params": {"role": "member", "name": f"{tenant}-2"}})
                assert "result" in answer.json(), answer.text
        for tenant, reader in readers.items():
            # tenant.created, the admin token, the member token: all theirs, none of the other's.
            seen = reader.events(3)
            assert {e["tenantId"] for e in seen} == {tenant}
            assert [e["type"] for e in seen] == ["tenant.created", "token.created", "token.created"]
            later = reader.until(lambda line: "heartbeat" in line and line["head"] >= 9)
            assert all(line.get("tenantId", tenant) == tenant for line in later)
        everything = root.events(9)
        assert {e["tenantId"] for e in everything} == {"root", "acme", "beta"}
        assert [e["sequence"] for e in everything] == sorted(e["sequence"] for e in everything)
        for reader in [*readers.values(), root]:
            reader.close()


def test_a_watcher_10000_events_behind_catches_up_in_order(env: dict[str, str]) -> None:
    token = initialize(env)
    runtime = open_runtime(env)
    try:
        with serve(watch_env(env, BETTER_COMPUTE_WATCH_WINDOW="1000")) as server:
            write_sites(runtime, 10_000, per_save=100)
            expected = log_sequences(runtime)
            # How fast it catches up is benchmarks/watch.py's to measure: here only that it
            # does, with a bound no loaded machine reaches (a hang fails, a slow run does not).
            reader = Reader(server, token, _ca(env), since=0)
            got = [e["sequence"] for e in reader.events(len(expected), timeout=240)]
            assert got == expected  # every event, in order, none twice
            assert len(got) >= 10_000
            # Then it follows live events like any other watcher.
            live = write_sites(runtime, 1)
            assert reader.events(1)[0]["sequence"] == live[0]
            reader.close()
    finally:
        runtime.close()


def test_refusals_come_before_the_stream_with_http_status(env: dict[str, str]) -> None:
    token = initialize(env)
    with serve(watch_env(env)) as server, httpx.Client(verify=ssl.create_default_context(cafile=str(_ca(env)))) as http:
        url = f"{server.url}/api/compute/events/watch"
        auth = {"authorization": f"Bearer {token}"}
        beyond = http.get(url, params={"since": 1_000_000}, headers=auth)
        assert beyond.status_code == 410
        assert beyond.json()["error"]["code"] == "expired"
        assert "--since 0" in beyond.json()["error"]["message"]
        assert http.get(url, params={"since": 0}).status_code == 401
        bad_glob = http.get(url, params={"types": "node.*;drop"}, headers=auth)
        assert bad_glob.status_code == 400 and "node.*" in bad_glob.json()["error"]["message"]
        assert http.get(url, params={"since": "x"}, headers=auth).status_code == 400
        assert http.get(url, params={"sinse": "1"}, headers=auth).status_code == 400
        assert http.get(url, params={"since": "-1"}, headers=auth).status_code == 400
