"""join-tokens create/list/get/revoke through the CLI, in-process, on each backend."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import NotFound, PermissionDenied
from tests.support import POLICY, cli_inprocess, initialize, open_runtime


def _pool(env: dict[str, str], tmp_path: Path) -> tuple[str, str]:
    initialize(env)
    code, site, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region", "eu-1",
                                     "--key", "site-eu-1", "--query", "id"], env)
    assert code == 0, err
    policy = tmp_path / "pool-policy.json"
    policy.write_text(json.dumps(POLICY))
    code, pool, err = cli_inprocess(
        ["pools", "create", "--site", site.strip(), "--class", "metal-host", "--gpu-model",
         "H100", "--policy-file", str(policy), "--key", "pool-eu-1-h100", "--query", "id"], env)
    assert code == 0, err
    return site.strip(), pool.strip()


def _tokens(env: dict[str, str]) -> Any:  # the parsed JSON
    code, out, err = cli_inprocess(["join-tokens", "list"], env)
    assert code == 0, err
    return json.loads(out)


def test_create_writes_the_secret_once_to_a_new_file(env: dict[str, str], tmp_path: Path
                                                     ) -> None:
    _, pool = _pool(env, tmp_path)
    out = tmp_path / "join-token"
    argv = ["join-tokens", "create", "--pool", pool, "--ttl", "2h", "--max-uses", "1",
            "--expect-serial", "SN-7701", "--key", "join-sn-7701", "--out", str(out)]
    code, stdout, err = cli_inprocess(argv, env)
    assert code == 0, err
    doc = json.loads(stdout)
    secret = out.read_text().strip()
    assert secret.startswith("bcjt_") and secret not in stdout and "token" not in doc
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert (doc["state"], doc["maxUses"], doc["expect"], doc["ttl"]) == (
        "active", 1, {"serial": "SN-7701"}, "2h")
    assert doc["id"].startswith("jt_") and doc["tokenFile"] == str(out)

    # The same command again: --out exists, so nothing is minted and the file is untouched.
    code, _, err = cli_inprocess(argv, env)
    assert code == 6 and "never overwritten" in err  # conflict
    assert out.read_text().strip() == secret
    # The same key to a new file: the same token, whose secret is not shown again.
    code, _, err = cli_inprocess([*argv[:-1], str(tmp_path / "again")], env)
    assert code == 6 and doc["id"] in err and "shown once" in err
    assert not (tmp_path / "again").exists()
    # The same key with other parameters: a conflict.
    code, _, err = cli_inprocess(["join-tokens", "create", "--pool", pool, "--ttl", "1h",
                                  "--key", "join-sn-7701"], env)
    assert code == 6 and "different parameters" in err
    assert [t["id"] for t in _tokens(env)] == [doc["id"]]


def test_bad_input_mints_nothing(env: dict[str, str], tmp_path: Path) -> None:
    _, pool = _pool(env, tmp_path)
    cases = [
        (["--ttl", "25h"], "1m to 24h"),
        (["--ttl", "30s"], "1m to 24h"),
        (["--ttl", "soon"], "not a duration"),
        (["--ttl", "2h", "--max-uses", "0"], "--max-uses"),
        (["--ttl", "2h", "--expect-mac", "nope"], "not a MAC"),
        (["--ttl", "2h", "--out", str(tmp_path / "missing" / "join-token")], "does not exist"),
    ]
    for extra, needle in cases:
        code, _, err = cli_inprocess(["join-tokens", "create", "--pool", pool, *extra], env)
        assert code != 0 and needle in err, (extra, err)
    code, _, err = cli_inprocess(["join-tokens", "create", "--pool", pool, "--ttl", "2h",
                                  "--expect-serial", "A", "--expect-mac", "52:54:00:ab:cd:ef"],
                                 env)
    assert code == 2 and "not allowed with" in err
    assert _tokens(env) == []


def test_list_get_revoke(env: dict[str, str], tmp_path: Path) -> None:
    _, pool = _pool(env, tmp_path)
    code, stdout, err = cli_inprocess(["join-tokens", "create", "--pool", pool, "--ttl", "10m",
                                       "--max-uses", "3", "--expect-mac", "52-54-00-AB-CD-EF"],
                                      env)
    assert code == 0, err
    created = json.loads(stdout)
    assert created["token"].startswith("bcjt_")  # without --out the secret is printed, once
    token_id = created["id"]
    code, out, _ = cli_inprocess(["join-tokens", "get", token_id, "--query", "expect.mac"], env)
    assert (code, out.strip()) == (0, "52:54:00:ab:cd:ef")
    code, out, _ = cli_inprocess(["join-tokens", "list", "--pool", pool, "--query", "[].id"],
                                 env)
    assert json.loads(out) == [token_id]
    assert "token" not in _tokens(env)[0]
    code, out, err = cli_inprocess(["join-tokens", "revoke", token_id, "--query", "state"], env)
    assert (code, out.strip()) == (0, "revoked"), err
    code, _, err = cli_inprocess(["join-tokens", "revoke", token_id], env)
    assert code == 6 and "already revoked" in err
    assert _tokens(env)[0]["state"] == "revoked"


def test_other_tenants_neither_mint_nor_see(env: dict[str, str], tmp_path: Path) -> None:
    _, pool = _pool(env, tmp_path)
    assert cli_inprocess(["tenants", "create", "acme"], env)[0] == 0
    assert cli_inprocess(["pools", "offer", pool, "--to", "acme", "--quota", "gpu=8"], env)[0] == 0
    code, out, err = cli_inprocess(["join-tokens", "create", "--pool", pool, "--ttl", "1h",
                                    "--query", "id"], env)
    assert code == 0, err
    token_id = out.strip()
    runtime = open_runtime(env)
    try:
        joins = runtime.services.join
        acme_admin = Principal("acme", Role.ADMIN, "tok_acme")
        with pytest.raises(PermissionDenied):  # offered the pool, but does not own it
            joins.create(acme_admin, pool, "1h", 1, None, None, None, None)
        with pytest.raises(NotFound):
            joins.get(acme_admin, token_id)
        with pytest.raises(NotFound):
            joins.revoke(acme_admin, token_id)
        assert joins.list(acme_admin, None, None) == []
        with pytest.raises(PermissionDenied):
            joins.list(acme_admin, "root", None)
        with pytest.raises(PermissionDenied):
            joins.revoke(Principal("root", Role.MEMBER, "tok_member"), token_id)
        reader = Principal("root", Role.READ_ONLY, "tok_reader")
        assert joins.get(reader, token_id)["state"] == "active"
        assert [t["id"] for t in joins.list(reader, None, None)] == [token_id]
    finally:
        runtime.close()
