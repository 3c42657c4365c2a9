"""bcd shipped as one file: scripts/build-bcd's zipapp joins a real server on its own.

The file runs with ``python -I -S`` (no site-packages, no PYTHON* variables), so
everything it imports must come from inside it. Building needs the package
index pip is configured with (wheels are cached after the first build).
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

from better_compute.agent.gpu import write_fake_fleet_file
from tests.support import CLI, client_env, initialize, run, serve, store_env

ROOT = Path(__file__).resolve().parents[2]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_single_file_build_joins_a_server(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = subprocess.run(
        [str(ROOT / "scripts/build-bcd")], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHON": sys.executable, "BCD_PYTHONS": PYTHON,
             "DIST_DIR": str(dist)},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    path_text, digest = built.stdout.split()
    bcd = Path(path_text)
    assert bcd.parent == dist and bcd.name.startswith("bcd_") and "_linux_" in bcd.name
    assert hashlib.sha256(bcd.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(bcd.stat().st_mode) == 0o755
    assert bcd.read_bytes().startswith(b"#!/usr/bin/env python3\n")

    env = store_env("sqlite", tmp_path)
    token = initialize(env)
    write_fake_fleet_file(tmp_path / "gpus.json", serial="SN-7701")
    node = {"PATH": os.environ.get("PATH", ""), "SHIV_ROOT": str(tmp_path / "shiv"),
            "BCD_ROOT": str(tmp_path / "root"), "BCD_GPU_SOURCE": f"fake:{tmp_path / 'gpus.json'}"}
    isolated = [sys.executable, "-I", "-S", str(bcd)]
    version = run([*isolated, "--version"], node)
    assert version.returncode == 0 and version.stdout.startswith("bcd "), version.stderr

    with serve(env, "--gateway-url", "https://gw.example.com:8443") as server:
        operator = client_env(env, server, token)

        def cli(*argv: str) -> str:
            done = run([CLI, *argv], operator, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            return done.stdout.strip()

        site = cli("sites", "create", "--kind", "shared", "--region", "eu-1", "--query", "id")
        (tmp_path / "policy.json").write_text('{"acceptance": [], "expect": {"gpuCount": 8}}')
        pool = cli("pools", "create", "--site", site, "--class", "metal-host", "--gpu-model",
                   "H100", "--policy-file", "policy.json", "--query", "id")  # fmt: skip
        cli("join-tokens", "create", "--pool", pool, "--ttl", "1h", "--max-uses", "1",
            "--out", "join-token")  # fmt: skip
        api = server.url + "/api/compute"
        doctor = run([*isolated, "doctor", "--server", api], node)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "OK    GPU source: fake: 8 GPU(s)" in doctor.stdout
        pins = []
        for name, flag in (("servingCaSpkiPin", "--serving-ca-pin"),
                           ("joinSigningKeyPin", "--join-signing-pin"),
                           ("joinEncryptionKeyPin", "--join-encryption-pin")):  # fmt: skip
            pins += [flag, cli("pki", "show", "--query", name)]
        joined = run([*isolated, "join", "--server", api, *pins],
                     node, input=(tmp_path / "join-token").read_text())  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    assert joined.stdout.startswith("joined as node_")
    assert (tmp_path / "root/etc/bcd/config.toml").exists()
