"""Every bad input the foundation names gets a clear error and changes nothing.

Each case runs the CLI in-process (the same code path as the installed
command, without a process start) against an initialized store that already
holds a site, a pool offered to ``acme`` and an ``acme`` admin token. After the
command, the head of the event log must not have moved, and the error must
name the problem and the fix. That is why the tests share one such store (a module's, on
each backend): none of them changes it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from better_compute.api.runtime import Runtime
from better_compute.cli import exit_codes
from better_compute.domain.access import LOCAL_OPERATOR
from tests.support import POLICY, cli_inprocess, initialize, open_runtime

FORGED_TOKEN = "biam_" + "A" * 43


@dataclass
class Store:
    env: dict[str, str]
    rt: Runtime
    tmp: Path
    ids: dict[str, str] = field(default_factory=dict)

    def head(self) -> int:
        return self.rt.store.recorder.max_notification_id() or 0

    def refused(self, argv: list[str], *needles: str, code: int | None = None,
                env: dict[str, str] | None = None) -> str:
        """``code`` None: the exit status of the error class `error [CODE]:` names."""
        before = self.head()
        got, out, err = cli_inprocess(argv, {**self.env, **(env or {})})
        if code is None:
            named = re.search(r"^error \[(\w+)\]: ", err, re.M)
            assert named is not None, f"{argv}: no `error [code]:` line in {err!r}"
            code = exit_codes.for_code(named.group(1))
        assert got == code != 0, f"{argv}: exit {got}, stdout={out!r} stderr={err!r}"
        assert out == "", f"{argv} printed a result although it failed: {out!r}"
        for needle in needles:
            assert needle in err, f"{argv}: {needle!r} not in {err!r}"
        assert self.head() == before, f"{argv} changed the store although it failed"
        return err


@pytest.fixture(scope="module")
def store(shared_env: dict[str, str],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """One such store a module and backend: every test that uses it is refused, and each
    refusal asserts that the event log did not move, so none sees another's traces."""
    env, tmp_path = shared_env, tmp_path_factory.mktemp("bad-input")
    initialize(env)
    rt = open_runtime(env)
    s = Store(env, rt, tmp_path)
    service = rt.service
    service.tenants_create(LOCAL_OPERATOR, "acme", None)
    s.ids["acme_token"] = service.tokens_create(LOCAL_OPERATOR, "acme", "admin", None)["token"]
    s.ids["site"] = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, "site-eu-1")["id"]
    s.ids["pool"] = service.pools_create(LOCAL_OPERATOR, s.ids["site"], "metal-host", "H100",
                                         POLICY, None, "pool-eu-1-h100")["id"]
    service.pools_offer(LOCAL_OPERATOR, s.ids["pool"], "acme", {"gpu": 16})
    for name, content in [
        ("good", json.dumps(POLICY)),
        ("unknown-field", json.dumps({**POLICY, "expect": {"gpuCount": 8, "colour": "red"}})),
        ("unknown-top", json.dumps({**POLICY, "acceptence": []})),
        ("bad-kind", json.dumps({"acceptance": [{"kind": "diag.foo"}],
                                 "expect": {"gpuCount": 8}})),
        ("count-0", json.dumps({**POLICY, "expect": {"gpuCount": 0}})),
        ("count-65", json.dumps({**POLICY, "expect": {"gpuCount": 65}})),
        ("count-str", json.dumps({**POLICY, "expect": {"gpuCount": "8"}})),
        ("no-count", json.dumps({"acceptance": [{"kind": "diag.nvml"}]})),
        ("not-json", "acceptance: diag.nvml\n"),
        ("array", "[]"),
    ]:
        (tmp_path / f"{name}.json").write_text(content)
    s.ids["policy"] = str(tmp_path / "good.json")
    try:
        yield s
    finally:
        rt.close()


def _pool_create(s: Store, policy: str, *extra: str, model: str = "H100") -> list[str]:
    return ["pools", "create", "--site", s.ids["site"], "--class", "metal-host", "--gpu-model",
            model, "--policy-file", str(s.tmp / f"{policy}.json"), *extra]


def test_unknown_flags_exit_2_and_name_the_command(store: Store) -> None:
    err = store.refused(["sites", "create", "--kind", "shared", "--region", "eu-2",
                         "--colour", "red"], "unrecognized arguments: --colour red",
                        "better-compute help sites create", code=2)
    assert "Traceback" not in err
    store.refused(["pools", "offer", store.ids["pool"], "--to", "acme", "--quota", "gpu=1",
                   "--force"], "--force", "help pools offer", code=2)
    store.refused(["sites", "create", "--region", "eu-2"], "--kind", code=2)
    store.refused(["nodes-that-do-not-exist"], "invalid choice", code=2)


def test_wrong_or_malformed_token(store: Store) -> None:
    store.refused(["sites", "create", "--kind", "shared", "--region", "eu-2"],
                  "unknown or revoked", env={"BETTER_COMPUTE_TOKEN": FORGED_TOKEN})
    store.refused(["api", "system.whoami"], "start with biam_",
                  env={"BETTER_COMPUTE_TOKEN": "hunter2"})


@pytest.mark.parametrize("quota,needle", [
    ("gpus=16", "gpu (singular)"),
    ("cpu=4", "'cpu' is not known"),
    ("gpu=16,memory=64", "'memory' is not known"),
    ("gpu=-1", "is not RESOURCE=N"),
    ("gpu=lots", "is not RESOURCE=N"),
    ("16", "is not RESOURCE=N"),
])
def test_quota_other_than_gpu_grants_nothing(store: Store, quota: str, needle: str) -> None:
    store.refused(["pools", "offer", store.ids["pool"], "--to", "acme", "--quota", quota],
                  needle, "gpu=16")
    doc = store.rt.service.pools_get(LOCAL_OPERATOR, store.ids["pool"])
    assert doc["offerings"] == [{"tenantId": "acme", "quota": {"gpu": 16}}]


@pytest.mark.parametrize("policy,needles", [
    ("unknown-field", ("unknown field `colour`", "$.expect")),
    ("unknown-top", ("unknown field `acceptence`",)),
    ("bad-kind", ("'diag.foo'", "acceptance kinds: diag.nvml")),
    ("count-0", ("gpuCount is 0", "from 1 to 64")),
    ("count-65", ("gpuCount is 65", "from 1 to 64")),
    ("count-str", ("$.expect.gpuCount",)),
    ("no-count", ("needs expect.gpuCount",)),
    ("not-json", ("is not JSON",)),
    ("array", ("must hold a JSON object",)),
    ("missing", ("cannot read it",)),
])
def test_invalid_policy_files(store: Store, policy: str, needles: tuple[str, ...]) -> None:
    store.refused(_pool_create(store, policy), *needles)


def test_site_kind_region_and_key(store: Store) -> None:
    for kind in ("private", "Shared", ""):
        store.refused(["sites", "create", "--kind", kind, "--region", "eu-2"],
                      "use shared or dedicated")
    store.refused(["sites", "create", "--kind", "shared", "--region", "eu 2"],
                  "is not a region name")
    store.refused(["sites", "create", "--kind", "shared", "--region", "eu-2", "--key", "a key"],
                  "is not a valid idempotency key")


def test_only_root_creates_sites(store: Store) -> None:
    acme = {"BETTER_COMPUTE_TOKEN": store.ids["acme_token"]}
    for kind in ("shared", "dedicated"):
        store.refused(["sites", "create", "--kind", kind, "--region", "eu-2"],
                      "only the root tenant creates platform sites", env=acme)


def test_same_key_different_parameters_is_a_conflict(store: Store) -> None:
    store.refused(["sites", "create", "--kind", "shared", "--region", "eu-2", "--key",
                   "site-eu-1"], "--key 'site-eu-1' was already used", store.ids["site"])
    store.refused(["sites", "create", "--kind", "dedicated", "--region", "eu-1", "--key",
                   "site-eu-1"], "different parameters")
    store.refused(_pool_create(store, "good", "--key", "pool-eu-1-h100", model="A100"),
                  "--key 'pool-eu-1-h100' was already used", store.ids["pool"])
    store.refused(_pool_create(store, "count-65", "--key", "pool-eu-1-h100"), "gpuCount is 65")
    # The same parameters are a retry: the same objects come back, nothing is written.
    before = store.head()
    code, out, _ = cli_inprocess(_pool_create(store, "good", "--key", "pool-eu-1-h100",
                                              "--query", "id", model="H100-SXM5-80GB"), store.env)
    assert (code, out.strip(), store.head()) == (0, store.ids["pool"], before)


@pytest.mark.parametrize("model", ["H10", "RTX9999", "nvidia", ""])
def test_unknown_gpu_model(store: Store, model: str) -> None:
    store.refused(_pool_create(store, "good", model=model), "names no GPU family", "H100")


def test_malformed_ids(store: Store) -> None:
    site, pool = store.ids["site"], store.ids["pool"]
    store.refused(["pools", "get", "pool_xyz"], "'pool_xyz' is not a pool id")
    store.refused(["pools", "get", site], "is not a pool id", "pool_ followed by 26")
    store.refused(["sites", "get", pool], "is not a site id")
    store.refused(["tokens", "revoke", "tok_1"], "is not a tok id")
    # Anything but an id is a name (api/services/names.py): one that names nothing is not found.
    store.refused(["sites", "get", "garbage"], "no site named 'garbage'", code=3)
    store.refused(["pools", "offer", "nope", "--to", "acme", "--quota", "gpu=1"],
                  "no pool named 'nope'", "pools list", code=3)
    store.refused(["pools", "list", "--site", "eu-1"], "no site named 'eu-1'", code=3)
    store.refused(["pools", "create", "--site", "site-eu-9", "--class", "metal-host",
                   "--gpu-model", "H100", "--policy-file", store.ids["policy"]],
                  "no site named 'site-eu-9'", code=3)
    store.refused(["pools", "get", "pool_" + "a" * 25 + "q"], "no pool", code=3)


def test_plain_http_to_a_remote_host_is_refused(store: Store) -> None:
    for url in ("http://compute.example.com", "http://10.0.0.1:8080/api/compute"):
        store.refused(["api", "system.whoami"], "plain http", "https://",
                      env={"BETTER_COMPUTE_URL": url, "BETTER_COMPUTE_TOKEN": FORGED_TOKEN})
    store.refused(["sites", "list"], "is not an http(s) URL",
                  env={"BETTER_COMPUTE_URL": "ftp://compute.example.com"})


def test_missing_ca_file(store: Store) -> None:
    missing = str(store.tmp / "no-such-ca.pem")
    store.refused(["api", "system.whoami"], "BETTER_COMPUTE_CA_FILE", missing,
                  env={"BETTER_COMPUTE_URL": "https://127.0.0.1:9", "BETTER_COMPUTE_CA_FILE":
                       missing, "BETTER_COMPUTE_TOKEN": FORGED_TOKEN})
    not_pem = store.tmp / "not-a-ca.pem"
    not_pem.write_text("hello\n")
    store.refused(["api", "system.whoami"], "not a readable PEM bundle",
                  env={"BETTER_COMPUTE_URL": "https://127.0.0.1:9", "BETTER_COMPUTE_CA_FILE":
                       str(not_pem), "BETTER_COMPUTE_TOKEN": FORGED_TOKEN})


def test_out_file_that_exists_is_never_overwritten(store: Store) -> None:
    existing = store.tmp / "token"
    existing.write_text("keep me\n")
    store.refused(["tokens", "create", "--tenant", "acme", "--role", "member", "--out",
                   str(existing)], "already exists", "never overwritten")
    assert existing.read_text() == "keep me\n"
    store.refused(["tokens", "create", "--tenant", "acme", "--role", "member", "--out",
                   str(store.tmp / "no-dir" / "token")], "does not exist")


@pytest.mark.parametrize("argv,needles", [
    (["api", "pools.offer", "poolId={pool}", "toTenantId=acme", "quota:=16"],
     ("invalid params for pools.offer", "Expected `object`, got `int`", "$.quota")),
    (["api", "pools.offer", "poolId={pool}", "toTenantId=acme", "quota=16"],
     ("invalid params for pools.offer", "Expected `object`, got `str`", "$.quota")),
    (["api", "pools.offer", "poolId={pool}", "toTenantId=acme", "quota:={{\"gpu\":\"16\"}}"],
     ("is not a whole number",)),
    (["api", "tenants.create", "tenantId:=42"], ("Expected `str`, got `int`", "$.tenantId")),
    (["api", "sites.create", "kind=shared", "region=eu-3", "name:=oops"],
     ("the value after := is not JSON",)),
    (["api", "sites.create", "kind=shared", "region=eu-3", "colour=red"],
     ("unknown field `colour`", "rpc.discover")),
    (["api", "sites.get"], ("missing required field `siteId`",)),
    (["api", "sites.create", "kind", "shared"], ("is not name=value or name:=JSON",)),
    (["api", "sites.creat", "kind=shared", "region=eu-3"], ("no method 'sites.creat'",
                                                             "sites.create")),
    (["api", "pools.create", "siteId={site}", "class=metal-host", "gpuModel=H100",
      "policy:=[1]"], ("$.policy",)),
])
def test_wrong_params_through_api(store: Store, argv: list[str], needles: tuple[str, ...]) -> None:
    store.refused([a.format(**store.ids) for a in argv], *needles)


def test_other_bad_catalog_input(store: Store) -> None:
    pool = store.ids["pool"]
    store.refused(["pools", "offer", pool, "--to", "nobody", "--quota", "gpu=1"],
                  "no tenant 'nobody'", "tenants create nobody")
    store.refused(["pools", "offer", pool, "--to", "root", "--quota", "gpu=1"],
                  "effectively unlimited")
    store.refused(["tokens", "create", "--tenant", "acme", "--role", "boss"], "unknown role",
                  "read-only")
    store.refused(["tokens", "create", "--tenant", "acme", "--role", "root-admin"],
                  "only on the root tenant")
    store.refused(["tokens", "create", "--tenant", "nobody", "--role", "member"], "no tenant")
    store.refused(["tenants", "create", "ACME!"], "is not a valid tenant id")
    store.refused(["tenants", "create", "acme", "--name", "Another Acme"], "already exists")
    store.refused(["pools", "create", "--site", store.ids["site"], "--class", "vm",
                   "--gpu-model", "H100", "--policy-file", store.ids["policy"]],
                  "is not a pool class", "metal-host")
    store.refused(["sites", "list", "--query", "[0"], "is not a JMESPath expression")


def test_a_store_that_was_never_initialized(tmp_path: Path, env: dict[str, str]) -> None:
    code, out, err = cli_inprocess(["pki", "show"], env)
    assert (code, out) == (10, "") and err.startswith("error [not_initialized]: ")
    assert "better-compute init" in err
    code, _, err = cli_inprocess(["api", "system.whoami"], {**env, "BETTER_COMPUTE_TOKEN":
                                                           FORGED_TOKEN})
    # No token is known before `init`: what to fix is the missing init, not the token.
    assert code == 10 and "error [not_initialized]: " in err
    rt = open_runtime(env)
    try:
        assert (rt.store.recorder.max_notification_id() or 0) == 0
    finally:
        rt.close()
