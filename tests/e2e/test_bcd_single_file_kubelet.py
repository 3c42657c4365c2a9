"""bcd shipped as one file carries its kubelet device plugin: grpcio and the stubs inside.

scripts/build-bcd's zipapp, run as ``python -I -S`` (nothing outside the file importable),
joins a real server's kubernetes pool, is adopted, and its plugin registers with a test
kubelet (tests/kubelet.py) as bcd.dev/gpu and lists the GPUs of a `reserve --kubernetes`.
Building needs the package index pip is configured with (wheels are cached after the first).
It also runs `bcd node` from the single file, which needs everything the agent imports
(pyyaml for vendor specs among them).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.cluster import running_cluster
from tests.kubelet import KUBERNETES_POLICY, kubelet_on, short_tempdir
from tests.support import store_env

ROOT = Path(__file__).resolve().parents[2]
FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}


def test_the_single_files_plugin_registers_with_the_kubelet(
        tmp_path: Path, single_file_bcd: tuple[Path, str]) -> None:
    single_file = str(single_file_bcd[0])

    env = store_env("sqlite", tmp_path)  # one build is enough: the node side has no store
    with short_tempdir() as short, running_cluster(
            env, tmp_path, FAST, policy=KUBERNETES_POLICY,
            machine_folder=short / "SN-7701") as c:
        c.machine.command = [sys.executable, "-I", "-S", single_file]
        c.machine.env["SHIV_ROOT"] = str(short / "shiv")
        with kubelet_on(c) as kubelet:
            registration = kubelet.wait_registration(1)
            assert (registration.resource_name, registration.endpoint) == \
                ("bcd.dev/gpu", "bcd-gpu.sock")
            doc = c.cli_json("reserve", "--pool", c.pool, "--gpus", "2", "--for", "1h",
                             "--kubernetes")
            kubelet.wait_list(lambda d: d == dict.fromkeys(doc["gpus"], "Healthy"),
                              "the reservation's 2 GPUs")
            grant = kubelet.allocate(doc["gpus"])
            assert [d.name for d in grant.cdi_devices] == [f"bcd.dev/gpu={u}" for u in doc["gpus"]]
