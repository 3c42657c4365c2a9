"""The tutorial's first two sections, in-process on each backend."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import POLICY, cli_inprocess, initialize


def test_site_pool_and_offer_in_process(env: dict[str, str], tmp_path: Path) -> None:
    initialize(env)
    code, site, err = cli_inprocess(
        ["sites", "create", "--kind", "shared", "--region", "eu-1", "--key", "site-eu-1",
         "--query", "id"], env)
    assert code == 0, err
    site = site.strip()
    assert site.startswith("site_")
    policy = tmp_path / "pool-policy.json"
    policy.write_text(json.dumps(POLICY))
    code, pool, err = cli_inprocess(
        ["pools", "create", "--site", site, "--class", "metal-host", "--gpu-model", "H100",
         "--policy-file", str(policy), "--key", "pool-eu-1-h100", "--query", "id"], env)
    assert code == 0, err
    pool = pool.strip()
    assert cli_inprocess(["tenants", "create", "acme"], env)[0] == 0
    code, out, err = cli_inprocess(["pools", "offer", pool, "--to", "acme", "--quota", "gpu=16"], env)
    assert code == 0, err
    assert json.loads(out)["offerings"] == [{"tenantId": "acme", "quota": {"gpu": 16}}]
    code, out, _ = cli_inprocess(["pools", "get", pool], env)
    doc = json.loads(out)
    assert (doc["siteId"], doc["gpuModel"], doc["policy"]) == (site, "H100", POLICY)
