"""bcd doctor: each check's OK and FAIL, with the fix, and the exit status."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from better_compute.agent.config import AgentConfig, ServerSection, save
from better_compute.agent.control_plane import Fetched
from better_compute.agent.doctor import doctor
from better_compute.agent.errors import BcdError
from better_compute.agent.gpu import write_fake_fleet_file
from better_compute.agent.paths import Paths
from better_compute.api import pki
from tests.bcd_fake_control_plane import well_known_of

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SERVER = "https://compute.example.com/api/compute"

Machine = tuple[Paths, dict[str, str]]  # the machine fixture: its Paths and its environment
Fetch = Callable[[str], Fetched]


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    write_fake_fleet_file(tmp_path / "gpus.json", gpus=4)
    env = {"BCD_ROOT": str(tmp_path / "root"), "BCD_GPU_SOURCE": f"fake:{tmp_path / 'gpus.json'}"}
    return Paths.from_env(env), env


def run(paths: Paths, env: dict[str, str], fetch: Fetch, server: str | None = SERVER
        ) -> tuple[int, str]:
    out = io.StringIO()
    code = doctor(paths=paths, env=env, server=server, out=out, fetch=fetch, now=lambda: NOW)
    return code, out.getvalue()


def serving(bundle: pki.PkiBundle, skew: timedelta = timedelta(0)) -> Fetch:
    def fetch(url: str) -> Fetched:
        assert url == SERVER
        return Fetched(well_known_of(bundle), NOW - skew)
    return fetch


def test_a_healthy_machine_passes_every_check(machine: Machine) -> None:
    paths, env = machine
    code, out = run(paths, env, serving(pki.generate_bundle(), timedelta(seconds=2)))
    assert code == 0, out
    assert "OK    GPU source: fake: 4 GPU(s) (NVIDIA H100 80GB HBM3)" in out
    assert f"OK    server: {SERVER} answers the well-known document" in out
    assert "OK    clock: within 2s of the server's" in out
    assert out.rstrip().endswith("all checks passed")


def test_failures_say_what_to_fix_and_exit_1(machine: Machine, tmp_path: Path) -> None:
    paths, env = machine
    env = {**env, "BCD_GPU_SOURCE": f"fake:{tmp_path / 'absent.json'}"}

    def unreachable(url: str) -> Fetched:
        raise BcdError(f"cannot reach {url}: connection refused")

    code, out = run(paths, env, unreachable)
    assert code == 1
    assert "FAIL  GPU source: cannot read the GPUs" in out
    assert "FAIL  server: cannot reach" in out and "better-compute serve" in out
    assert "2 check(s) failed: GPU source, server" in out


def test_a_skewed_clock_fails(machine: Machine) -> None:
    paths, env = machine
    code, out = run(paths, env, serving(pki.generate_bundle(), timedelta(minutes=5)))
    assert code == 1
    assert "FAIL  clock: 300s off the server's clock" in out and "timedatectl" in out


def test_the_pre_join_config_is_checked_against_the_server(machine: Machine) -> None:
    paths, env = machine
    bundle, other = pki.generate_bundle(), pki.generate_bundle()
    paths.etc.mkdir(parents=True)
    pin = pki.public_parts(bundle)["servingCaSpkiPin"]
    save(paths.config, AgentConfig(server=ServerSection(url=SERVER, serving_ca_pin=pin)))
    code, out = run(paths, env, serving(bundle), server=None)
    assert code == 0 and "with the pinned serving CA" in out and "not joined yet" in out
    code, out = run(paths, env, serving(other), server=None)
    assert code == 1 and f"not the pinned {pin}" in out


def test_a_broken_config_fails_and_no_server_is_skipped(machine: Machine) -> None:
    paths, env = machine
    paths.etc.mkdir(parents=True)
    paths.config.write_text("[server]\nurll = 'typo'\n")
    code, out = run(paths, env, serving(pki.generate_bundle()), server=None)
    assert code == 1
    assert "FAIL  config:" in out and "urll" in out
    assert "SKIP  server: no server configured" in out
