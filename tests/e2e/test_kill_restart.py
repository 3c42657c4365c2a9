"""A server killed with SIGKILL right after a create loses nothing and books nothing twice.

The create was acknowledged, so it is in the store; on restart the same
--key returns the same object and no second one exists.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.support import VENV_BIN, client_env, initialize, run, serve

POLICY = '{"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}'


def _cli(env: dict[str, str], *argv: str, cwd: Path) -> str:
    shell = {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}"}
    result = run(["better-compute", *argv], shell, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_same_key_same_object_after_sigkill(env: dict[str, str], tmp_path: Path) -> None:
    token = initialize(env)
    (tmp_path / "pool-policy.json").write_text(POLICY)
    site_argv = ["sites", "create", "--kind", "shared", "--region", "eu-1", "--key", "site-eu-1",
                 "--query", "id"]

    def pool_argv(site: str) -> list[str]:
        return ["pools", "create", "--site", site, "--class", "metal-host", "--gpu-model", "H100",
                "--policy-file", "pool-policy.json", "--key", "pool-eu-1-h100", "--query", "id"]

    with serve(env) as server:
        cli = client_env(env, server, token)
        site = _cli(cli, *site_argv, cwd=tmp_path)
        pool = _cli(cli, *pool_argv(site), cwd=tmp_path)
        server.kill(signal.SIGKILL)
        assert server.process.returncode == -signal.SIGKILL
    assert site.startswith("site_") and pool.startswith("pool_")

    with serve(env) as server:
        cli = client_env(env, server, token)
        assert _cli(cli, *site_argv, cwd=tmp_path) == site
        assert _cli(cli, *pool_argv(site), cwd=tmp_path) == pool
        sites = json.loads(_cli(cli, "sites", "list", cwd=tmp_path))
        pools = json.loads(_cli(cli, "pools", "list", cwd=tmp_path))
        # A retry with other parameters is still a conflict after the restart.
        shell = {**cli, "PATH": f"{VENV_BIN}{os.pathsep}{cli.get('PATH', os.defpath)}"}
        clash = run(["better-compute", *site_argv[:5], "eu-2", *site_argv[6:]], shell)
        server.kill(signal.SIGKILL)
    assert [s["id"] for s in sites] == [site]
    assert [p["id"] for p in pools] == [pool]
    assert clash.returncode == 6 and "different parameters" in clash.stderr  # conflict
