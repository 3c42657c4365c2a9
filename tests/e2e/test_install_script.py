"""install-bcd.sh against a real `serve` over TLS, in a temp root, with a stub bcd download."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import tomllib
from pathlib import Path

from better_compute.agent.config import load as load_agent_config
from tests.support import POLICY, VENV_BIN, cli_inprocess, client_env, initialize, serve

GATEWAY = "https://gw.eu-1.example.com:8443"
STUB = """#!/bin/sh
# A stand-in for bcd: records how the install script runs it.
echo "bcd $*" >>"$BCD_ROOT/stub-bcd.log"
case "$1" in
  doctor) echo "doctor: all checks passed" ;;
  join) echo "stdin: $(cat)" >>"$BCD_ROOT/stub-bcd.log"
        echo "joined as node_stub (site site_stub, role node)" ;;
esac
"""


def _setup(env: dict[str, str], tmp_path: Path) -> tuple[str, str, Path]:
    initialize(env)
    code, site, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region", "eu-1",
                                     "--key", "site-eu-1", "--query", "id"], env)
    assert code == 0, err
    (tmp_path / "pool-policy.json").write_text(json.dumps(POLICY))
    code, pool, err = cli_inprocess(
        ["pools", "create", "--site", site.strip(), "--class", "metal-host", "--gpu-model",
         "H100", "--policy-file", str(tmp_path / "pool-policy.json"), "--key", "pool-1",
         "--query", "id"], env)
    assert code == 0, err
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "bcd_0.1.0_linux_amd64").write_text(STUB)
    (downloads / "bcd_0.1.0_linux_arm64").write_text(STUB)
    return site.strip(), pool.strip(), downloads


def _run_script(script: Path, root: Path, stdin: Path) -> subprocess.CompletedProcess[str]:
    # bcd's single-file build needs python3 >= 3.11; the venv's is one.
    env = {"PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "BCD_ROOT": str(root),
           "HOME": str(root)}
    with stdin.open() as f:
        return subprocess.run(["sh", str(script)], env=env, stdin=f, capture_output=True,
                              text=True, timeout=120, cwd=script.parent)


def test_install_script_verifies_installs_configures_and_joins(env: dict[str, str],
                                                               tmp_path: Path) -> None:
    site, pool, downloads = _setup(env, tmp_path)
    digest = hashlib.sha256(STUB.encode()).hexdigest()
    wrong = hashlib.sha256(b"something else").hexdigest()
    with serve({**env, "BETTER_COMPUTE_DOWNLOADS_DIR": str(downloads)},
               "--gateway-url", GATEWAY) as server:
        operator = client_env(env, server, initialize_token(env))
        pins = json.loads(cli_inprocess(["pki", "show"], operator)[1])
        code, _, err = cli_inprocess(
            ["join-tokens", "create", "--pool", pool, "--ttl", "2h", "--max-uses", "1",
             "--key", "join-1", "--out", str(tmp_path / "join-token")], operator)
        assert code == 0, err

        def script(name: str, sha: str) -> Path:
            code, _, err = cli_inprocess(
                ["daemon", "install-script", "--pool", pool, "--site", site, "--gateway-url",
                 GATEWAY, "--base-url", server.url, "--bcd-version", "0.1.0",
                 "--sha256", f"amd64={sha}", f"arm64={sha}", "--out", str(tmp_path / name)],
                operator)
            assert code == 0, err
            return tmp_path / name

        # A wrong digest stops the script before anything is installed or run.
        bad_root = tmp_path / "bad-root"
        refused = _run_script(script("bad.sh", wrong), bad_root, tmp_path / "join-token")
        assert refused.returncode != 0
        assert "digest mismatch" in refused.stderr and "nothing was installed" in refused.stderr
        assert not (bad_root / "usr").exists() and not (bad_root / "etc").exists()
        assert not (bad_root / "stub-bcd.log").exists()

        root = tmp_path / "root"
        done = _run_script(script("install-bcd.sh", digest), root, tmp_path / "join-token")
        assert done.returncode == 0, done.stderr

    bcd = root / "usr/local/bin/bcd"
    assert bcd.read_text() == STUB and stat.S_IMODE(bcd.stat().st_mode) == 0o755
    config = tomllib.loads((root / "etc/bcd/config.toml").read_text())
    assert config == {"server": {
        "url": server.url + "/api/compute", "gateway_url": GATEWAY,
        "serving_ca_pin": pins["servingCaSpkiPin"], "join_signing_pin": pins["joinSigningKeyPin"],
        "join_encryption_pin": pins["joinEncryptionKeyPin"]}}
    agent_view = load_agent_config(root / "etc/bcd/config.toml")  # what bcd join reads
    assert agent_view is not None and not agent_view.joined
    assert agent_view.server.join_signing_pin == pins["joinSigningKeyPin"]
    secret = (tmp_path / "join-token").read_text().strip()
    assert (root / "stub-bcd.log").read_text().splitlines() == [
        "bcd doctor", "bcd join", f"stdin: {secret}"]
    unit = (root / "etc/systemd/system/bcd.service").read_text()
    assert "ExecStart=/usr/local/bin/bcd node --config /etc/bcd/config.toml" in unit
    assert "sha256 of bcd_0.1.0_linux_amd64 verified" in done.stderr
    assert "not touching systemd" in done.stderr


def initialize_token(env: dict[str, str]) -> str:
    """A fresh root admin token for the HTTP client (init already ran in-process)."""
    code, out, err = cli_inprocess(["tokens", "create", "--tenant", "root", "--role", "admin",
                                    "--query", "token"], env)
    assert code == 0, err
    return out.strip()
