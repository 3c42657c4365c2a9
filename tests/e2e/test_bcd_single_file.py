"""bcd shipped as one file: scripts/build-bcd's zipapp runs the whole node path on a bare host.

The file is what ``install-bcd.sh`` downloads in production, so it is tested the way a GPU
server runs it: ``python3`` on the PATH is a bare interpreter (``-I -S``: no site-packages, no
PYTHON* variables, so nothing of this machine's packages can hide a missing dependency), the
install script downloads it from a real server, verifies its digest, runs ``bcd doctor`` and
``bcd join``; then ``bcd node`` is adopted, a reservation binds (the CDI spec is written),
``bcd status --json`` reads it, and a release removes it. Building needs the package index pip
is configured with (wheels are cached after the first build).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import Cluster, Machine, running_cluster
from tests.support import cli_inprocess, eventually, run, store_env

ROOT = Path(__file__).resolve().parents[2]
PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


@pytest.fixture
def built(single_file_bcd: tuple[Path, str]) -> tuple[Path, str]:
    """scripts/build-bcd for this Python only (the lock covers 3.11 to 3.13)."""
    return single_file_bcd


def bare_python(folder: Path) -> Path:
    """A folder whose ``python3`` is this interpreter with no site-packages at all."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "python3"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    shim.chmod(0o755)
    return folder


@pytest.mark.timeout(900)  # the build, when this test is the fixture's first user
def test_the_build_is_one_verifiable_file(built: tuple[Path, str]) -> None:
    bcd, digest = built
    assert bcd.name == f"bcd_0.1.0_linux_{'arm64' if os.uname().machine == 'aarch64' else 'amd64'}"
    assert hashlib.sha256(bcd.read_bytes()).hexdigest() == digest
    assert stat.S_IMODE(bcd.stat().st_mode) == 0o755
    assert bcd.read_bytes().startswith(b"#!/usr/bin/env python3\n")


@pytest.fixture
def cluster(tmp_path: Path, built: tuple[Path, str]) -> Iterator[Cluster]:
    """The tutorial's server with its downloads folder holding the built file."""
    bcd, _ = built
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / bcd.name).write_bytes(bcd.read_bytes())
    env = store_env("sqlite", tmp_path)
    with running_cluster({**env, "BETTER_COMPUTE_DOWNLOADS_DIR": str(downloads)}, tmp_path,
                         FAST) as c:
        yield c


@pytest.mark.timeout(900)  # the build (first use of the fixture) and the whole node path
def test_the_shipped_bcd_runs_the_whole_node_path_on_a_bare_python(
        cluster: Cluster, built: tuple[Path, str], tmp_path: Path) -> None:
    c = cluster
    bcd_file, digest = built
    bare = bare_python(tmp_path / "bare-bin")
    machine = c.machine
    machine.env.update(PATH=f"{bare}:/usr/bin:/bin", SHIV_ROOT=str(tmp_path / "shiv"))
    # The interpreter really is bare: this machine's pyyaml (which bcd needs) is out of its reach.
    probe = run(["python3", "-c", "import yaml"], machine.env)
    assert probe.returncode != 0 and "No module named 'yaml'" in probe.stderr

    # The operator generates the install script for the built file's digest ...
    arch = bcd_file.name.rsplit("_", 1)[1]
    version = bcd_file.name.split("_")[1]
    c.cli("join-tokens", "create", "--pool", c.pool, "--ttl", "2h", "--max-uses", "1",
          "--expect-serial", machine.serial, "--key", "join-bare",
          "--out", str(machine.folder / "join-token"))
    site = c.cli("pools", "get", c.pool, "--query", "siteId")
    c.cli("daemon", "install-script", "--pool", c.pool, "--site", site, "--base-url",
          c.server.url, "--bcd-version", version, "--sha256", f"{arch}={digest}",
          "--out", str(machine.folder / "install-bcd.sh"))
    # ... and the server runs it with the token on standard input: download, verify, doctor, join.
    with (machine.folder / "join-token").open() as token:
        installed = subprocess.run(["sh", "install-bcd.sh"], env=machine.env, stdin=token,
                                   capture_output=True, text=True, timeout=300,
                                   cwd=machine.folder)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert f"sha256 of {bcd_file.name} verified" in installed.stderr
    assert "joined as node_" in installed.stdout
    shipped = machine.root / "usr/local/bin/bcd"
    assert shipped.read_bytes() == bcd_file.read_bytes()
    machine.command = [str(shipped)]
    assert machine.bcd("--version").stdout.strip() == f"bcd {version}"
    node = installed.stdout.split("joined as ", 1)[1].split()[0]
    c.node = node

    # bcd node from the shipped file: the session comes up and the pool adopts the node.
    c.start_agent(epoch=1)
    eventually(lambda: c.provision_state(node) == "adopted", "the node is adopted")

    # A reservation binds on it: the hold's CDI spec is written by the shipped bcd.
    rsv = c.cli("reserve", "--pool", c.pool, "--gpus", "4", "--for", "1h", "--key", "bare-1",
                "--query", "id")
    eventually(lambda: c.state(rsv) == "active", "the reservation is active")
    alloc = c.cli("reservations", "get", rsv, "--query", "allocationId")
    spec = json.loads(c.spec_path(alloc).read_text())
    assert len(spec["devices"]) == 4

    status = machine.bcd("status", "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["node"]["id"] == node and doc["session"]["state"] == "connected"
    held = [g for g in doc["gpus"] if g["heldBy"] == alloc]
    assert len(held) == 4

    code, _, err = cli_inprocess(["release", rsv], c.env)
    assert code == 0, err
    eventually(lambda: not c.spec_path(alloc).exists(), "the shipped bcd removed the hold")
    for agent in machine.agents:
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""


@pytest.mark.timeout(900)
def test_bcd_on_a_bare_python_names_a_missing_join_cleanly(
        built: tuple[Path, str], tmp_path: Path) -> None:
    """The shipped file's own errors are one line, never an import traceback."""
    bcd, _ = built
    machine = Machine(tmp_path / "m")
    machine.command = [str(bcd)]
    machine.env.update(PATH=f"{bare_python(tmp_path / 'bin')}:/usr/bin:/bin",
                       SHIV_ROOT=str(tmp_path / "shiv"))
    done = machine.bcd("node")
    assert done.returncode == 10  # not_initialized: graded as the CLI grades it (docs/bcd.md)
    assert "Traceback" not in done.stderr and "bcd node:" in done.stderr
