"""Kubernetes workers end to end: `reserve --kubernetes`, bcd's device plugin, a kubelet.

Real `better-compute serve --gateway-listen`, `bcd join` and `bcd node` processes under
BCD_ROOT with the fake GPU source, and a test kubelet (tests/kubelet.py: the kubelet's
Registration service on kubelet.sock and a client of the plugin's DevicePlugin service, real
gRPC from the same api.proto) in the node's device-plugin folder. The pool's policy turns on
the plugin (`kubernetes`) and the container-toolkit unit (`nodeProfile`), whose nvidia-ctk is
the one stand-in besides the GPU source (tests/cdi_support.py ``fake_nvidia_ctk``).

As docs/kubernetes.md tells it: the plugin registers as bcd.dev/gpu; ListAndWatch lists
exactly the GPUs of kubernetes reservations (never a plain reservation's), with their health;
Allocate answers their CDI names and refuses any other GPU by name; a release takes the GPUs
out of the list before bcd removes the hold's CDI spec; a restarted kubelet gets a new
registration within 5 s; bcd removes its socket when it stops.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from better_compute.agent.gpu import set_fake_gpu_health
from tests.cdi_support import VENDOR_H100X8, check_cdi_spec, fake_nvidia_ctk
from tests.cluster import Cluster, running_cluster
from tests.kubelet import KUBERNETES_POLICY, Kubelet, Registration, kubelet_on, short_tempdir
from tests.support import eventually

FAST = {"BETTER_COMPUTE_NODE_HEARTBEAT": "1", "BETTER_COMPUTE_CONTROLLER_TICK": "0.2"}
WITH_TOOLKIT = {**KUBERNETES_POLICY, "nodeProfile": {"units": ["container-toolkit"]}}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with short_tempdir() as folder:
        yield folder


def with_numa_nodes(gpu_file: Path) -> None:
    """The simulated server's GPUs 0-3 sit on NUMA node 0, 4-7 on node 1."""
    document = json.loads(gpu_file.read_text())
    for gpu in document["gpus"]:
        gpu["numaNode"] = gpu["index"] // 4
    gpu_file.write_text(json.dumps(document))


class Output:
    """Every line `bcd node` prints, read by a thread (so its pipe never fills)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def index(self, needle: str, after: int = -1, timeout: float = 30.0) -> int:
        """The position of the first line after ``after`` that contains ``needle``."""
        def found() -> int | None:
            return next((n for n, line in enumerate(self.lines)
                         if n > after and needle in line), None)

        with self._changed:
            if not self._changed.wait_for(lambda: found() is not None, timeout):
                raise AssertionError(f"bcd node printed no line with {needle!r}: {self.lines}")
            return found()  # type: ignore[return-value]


@pytest.fixture
def cluster(env: dict[str, str], tmp_path: Path, short_dir: Path
            ) -> Iterator[tuple[Cluster, Kubelet, Path]]:
    """A kubernetes pool, its adopted node with nvidia-ctk and a kubelet, bcd running."""
    with running_cluster(env, tmp_path, FAST, policy=WITH_TOOLKIT,
                         machine_folder=short_dir / "SN-7701") as c:
        ctk_log = fake_nvidia_ctk(short_dir / "bin")
        c.machine.env["PATH"] = f"{short_dir / 'bin'}:{c.machine.env['PATH']}"
        with_numa_nodes(c.machine.gpu_file)
        with kubelet_on(c) as kubelet:
            yield c, kubelet, ctk_log


def reserve(c: Cluster, gpus: int, *flags: str) -> tuple[str, str, list[str]]:
    """reserve, wait until active; the reservation, its allocation and its GPUs."""
    doc = c.cli_json("reserve", "--pool", c.pool, "--gpus", str(gpus), "--for", "1h", *flags)
    eventually(lambda: c.state(doc["id"]) == "active", f"{doc['id']} is active")
    return doc["id"], doc["allocationId"], doc["gpus"]


def test_kubernetes_workers_get_exactly_the_gpus_they_reserved(
        cluster: tuple[Cluster, Kubelet, Path]) -> None:
    c, kubelet, ctk_log = cluster
    agent = c.machine.agents[0]
    output = Output(agent)
    policy = c.cli_json("pools", "get", c.pool, "--query", "policy")
    assert policy["kubernetes"] == {"resourceName": "bcd.dev/gpu"}
    assert policy["nodeProfile"] == {"units": ["container-toolkit"]}

    # The container-toolkit unit wrote NVIDIA's spec with nvidia-ctk, once.
    vendor = c.machine.root / "etc/cdi/nvidia.json"
    eventually(vendor.exists, "bcd generated etc/cdi/nvidia.json")
    assert vendor.read_bytes() == VENDOR_H100X8.read_bytes()
    assert ctk_log.read_text().splitlines() == [
        "cdi generate --format=json --device-name-strategy=uuid"]

    # The plugin registers as bcd.dev/gpu and lists nothing while nothing is held.
    assert kubelet.wait_registration(1) == Registration(
        "v1beta1", "bcd-gpu.sock", "bcd.dev/gpu", preferred_allocation=True)
    kubelet.wait_list(lambda devices: devices == {}, "an empty first list")

    # A plain reservation's GPUs are held on the node but never handed to the kubelet.
    plain, _, plain_gpus = reserve(c, 2)
    rsv, alloc, booked = reserve(c, 4, "--kubernetes")
    listed = kubelet.wait_list(lambda d: set(d) == set(booked), "exactly the 4 booked GPUs")
    assert listed == dict.fromkeys(booked, "Healthy")
    numa = json.loads(c.machine.gpu_file.read_text())["gpus"]
    assert kubelet.topology == {g["uuid"]: [g["numaNode"]] for g in numa if g["uuid"] in booked}
    binding = c.cli_json("reservations", "get", rsv, "--query", "binding")
    assert binding["kubernetes"] == {"resourceName": "bcd.dev/gpu", "deviceIds": booked}
    assert "kubernetes" not in c.cli_json("reservations", "get", plain, "--query", "binding")
    # The hold's spec took each GPU's device nodes from the generated vendor spec.
    spec = json.loads(c.spec_path(alloc).read_text())
    check_cdi_spec(spec)
    assert all(d["containerEdits"]["deviceNodes"] for d in spec["devices"])

    # Allocate: the CDI names of held GPUs; any other GPU is refused by name.
    grant = kubelet.allocate(booked[:2])
    assert [d.name for d in grant.cdi_devices] == [f"bcd.dev/gpu={u}" for u in booked[:2]]
    assert grant.envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(booked[:2])
    assert (grant.envs["BCD_ALLOCATION_ID"], grant.envs["BCD_RESERVATION_ID"]) == (alloc, rsv)
    with pytest.raises(grpc.RpcError) as refused:
        kubelet.allocate([booked[0], plain_gpus[0]])
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"{plain_gpus[0]} is not held for a kubernetes reservation" in \
        refused.value.details()

    # A second kubernetes reservation adds its GPUs; the preference keeps reservations whole.
    _, _, booked2 = reserve(c, 2, "--kubernetes")
    kubelet.wait_list(lambda d: set(d) == {*booked, *booked2}, "both reservations' GPUs")
    assert sorted(kubelet.preferred([*booked, *booked2], 2)) == sorted(booked2)

    # A GPU turning unhealthy in the GPU source is sent as Unhealthy.
    set_fake_gpu_health(c.machine.gpu_file, booked[1], healthy=False, reasons=["xid-79"])
    listed = kubelet.wait_list(lambda d: d.get(booked[1]) == "Unhealthy", "GPU 1 unhealthy")
    assert [u for u, health in listed.items() if health != "Healthy"] == [booked[1]]

    status = json.loads(c.bcd("status", "--json").stdout)["kubernetes"]
    assert (status["enabled"], status["registered"], status["resourceName"]) == \
        (True, True, "bcd.dev/gpu")
    assert sorted(d["id"] for d in status["devices"]) == sorted([*booked, *booked2])
    assert "kubelet  registered as bcd.dev/gpu since " in c.bcd("status").stdout

    # Release: the GPUs leave the list first, then bcd removes the hold's CDI spec.
    assert c.cli("release", rsv, "--query", "state") == "released"
    withdrew = output.index("kubelet: withdrew 4 GPU(s) before releasing their hold")
    output.index("section devices: applied: 2 bound, 0 failed, 1 released", after=withdrew)
    kubelet.wait_list(lambda d: set(d) == set(booked2), "only the second reservation's GPUs")
    eventually(lambda: not c.spec_path(alloc).exists(), "bcd removed the released hold's spec")

    # The kubelet restarts (its folder cleaned, kubelet.sock anew): bcd registers again, by
    # itself (it watches the folder: docs/decisions.md), with nothing else restarted.
    kubelet.restart()
    kubelet.wait_registration(2)
    kubelet.wait_list(lambda d: set(d) == set(booked2), "the list again after the restart")

    assert not any(set(plain_gpus) & set(devices) for devices in kubelet.lists)
    assert c.state(plain) == "active"  # the plain hold is untouched throughout

    # bcd stops: its socket goes with it. Started again, it registers with the same list.
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    assert not (c.machine.root / "var/lib/kubelet/device-plugins/bcd-gpu.sock").exists()
    c.start_agent(epoch=2)
    kubelet.wait_registration(3)
    kubelet.wait_list(lambda d: d == dict.fromkeys(booked2, "Healthy"), "the list after bcd's restart")


def test_reserve_kubernetes_is_refused_on_a_pool_without_the_policy(
        env: dict[str, str], tmp_path: Path) -> None:
    from tests.support import cli_inprocess

    with running_cluster(env, tmp_path, FAST) as c:
        code, out, err = cli_inprocess(["reserve", "--pool", c.pool, "--gpus", "1", "--for",
                                        "1h", "--kubernetes"], c.env)
        assert code != 0 and out == ""
        assert f"pool {c.pool} has no kubernetes in its policy" in err
        assert c.cli_json("reservations", "list") == []
