"""The tutorial's first two sections, typed into a shell exactly as written.

Once against a real `better-compute serve` over TLS on loopback (the exports
of "Act as the platform operator", with the serving CA `init` wrote), and once
in-process on the local store with no URL at all. Both on SQLite and on
PostgreSQL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from better_compute.domain.access import LOCAL_OPERATOR
from tests.support import POLICY, VENV_BIN, client_env, initialize, open_runtime, run, serve

# Lines between the `step` markers are the tutorial's, character for character.
TUTORIAL = r"""
set -euo pipefail
step() { printf '\n=== %s\n' "$1"; }
step whoami
better-compute api system.whoami
step help
better-compute help
step help-command
better-compute help pools create
step acme
better-compute tenants create acme
step site
export SITE=$(better-compute sites create --kind shared --region eu-1 --key site-eu-1 --query id)
echo "SITE=$SITE"
cat > pool-policy.json <<'JSON'
{
  "acceptance": [{ "kind": "diag.nvml" }],
  "expect": { "gpuCount": 8 }
}
JSON
step pool
export POOL=$(better-compute pools create --site $SITE --class metal-host --gpu-model H100 \
  --policy-file pool-policy.json --key pool-eu-1-h100 --query id)
echo "POOL=$POOL"
step pools-get
better-compute pools get $POOL
step offer
better-compute pools offer $POOL --to acme --quota gpu=16
step retry
better-compute sites create --kind shared --region eu-1 --key site-eu-1 --query id
better-compute pools create --site $SITE --class metal-host --gpu-model H100 \
  --policy-file pool-policy.json --key pool-eu-1-h100 --query id
step pins
better-compute pki show --query servingCaSpkiPin
better-compute pki show --query joinSigningKeyPin
better-compute pki show --query joinEncryptionKeyPin
step done
"""



def _shell(env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Run the tutorial in bash; the output of each step by its marker."""
    path = f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}"
    result = run(["bash", "-c", TUTORIAL], {**env, "PATH": path}, cwd=cwd, timeout=120)
    assert result.returncode == 0, f"stdout={result.stdout}\nstderr={result.stderr}"
    assert result.stderr == "", result.stderr
    steps: dict[str, str] = {}
    for chunk in result.stdout.split("\n=== ")[1:]:
        name, _, body = chunk.partition("\n")
        steps[name] = body
    assert "done" in steps, result.stdout
    return steps


def _check(steps: dict[str, str], whoami_token: bool) -> tuple[str, str]:
    me = json.loads(steps["whoami"])
    assert (me["tenantId"], me["role"], me["rootAdministrator"]) == ("root", "admin", True)
    assert (me["tokenId"] is not None) is whoami_token
    for group in ("tenants", "tokens", "sites", "pools", "pki", "api", "init", "serve"):
        assert f"    {group}" in steps["help"]
    assert "usage: better-compute pools create" in steps["help-command"]
    assert "--gpu-model" in steps["help-command"]
    assert json.loads(steps["acme"])["id"] == "acme"
    # `export X=$(…)` hides a failed command from `set -e`: the ids prove each one worked.
    site = steps["site"].strip().removeprefix("SITE=")
    pool = steps["pool"].strip().removeprefix("POOL=")
    assert site.startswith("site_") and len(site) == 31, steps["site"]
    assert pool.startswith("pool_") and len(pool) == 31, steps["pool"]
    got = json.loads(steps["pools-get"])
    assert (got["id"], got["siteId"], got["class"], got["gpuModel"], got["policy"]) == (
        pool, site, "metal-host", "H100", POLICY)
    assert got["ownerQuota"] == {"gpu": "unlimited"} and got["offerings"] == []
    offered = json.loads(steps["offer"])
    assert offered["offerings"] == [{"tenantId": "acme", "quota": {"gpu": 16}}]
    assert steps["retry"].split() == [site, pool]  # --key: the same site and pool again
    pins = steps["pins"].split()
    assert len(pins) == 3 and all(p.startswith("sha256/") and len(p) == 51 for p in pins)
    return site, pool


def _stored(env: dict[str, str], site: str, pool: str, pins: str) -> None:
    """What the shell did is in the store: one site, one pool, offered to acme."""
    rt = open_runtime(env)
    try:
        service = rt.service
        assert [s["id"] for s in service.sites_list(LOCAL_OPERATOR)] == [site]
        assert [p["id"] for p in service.pools_list(LOCAL_OPERATOR, None)] == [pool]
        assert service.pools_get(LOCAL_OPERATOR, pool)["offerings"] == [
            {"tenantId": "acme", "quota": {"gpu": 16}}]
        shown = service.pki_show(LOCAL_OPERATOR)
        expected = [shown["servingCaSpkiPin"], shown["joinSigningKeyPin"],
                    shown["joinEncryptionKeyPin"]]
        assert pins.split() == expected
    finally:
        rt.close()


def test_tutorial_against_serve_over_tls(env: dict[str, str], tmp_path: Path) -> None:
    token = initialize(env)
    work = tmp_path / "operator"
    work.mkdir()
    with serve(env, workers=None) as server:  # as the tutorial runs it: a worker per core
        assert server.url.startswith("https://127.0.0.1:")
        shell_env = client_env(env, server, token)
        steps = _shell(shell_env, work)
    site, pool = _check(steps, whoami_token=True)
    # Over HTTPS the CLI never opened a local store.
    assert not Path(shell_env["BETTER_COMPUTE_DATA_DIR"]).exists()
    _stored(env, site, pool, steps["pins"])


def test_tutorial_in_process_without_a_url(env: dict[str, str], tmp_path: Path) -> None:
    initialize(env)
    work = tmp_path / "operator"
    work.mkdir()
    steps = _shell({**env, "BETTER_COMPUTE_TENANT": "root"}, work)
    site, pool = _check(steps, whoami_token=False)
    _stored(env, site, pool, steps["pins"])
