"""`bcd status` shows the device plugin; the kubernetes and profile sections as applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.agent.node.apply import ApplyContext, apply_desired
from better_compute.agent.node.devices import unsupported
from better_compute.agent.node.journal import Journal
from better_compute.agent.node.render import render_status
from better_compute.agent.node.state import NodeState
from better_compute.agent.paths import Paths

BASE: dict[str, Any] = {
    "node": {"id": "node_1", "poolId": "pool_1", "siteId": "site_1", "tenantId": "root"},
    "session": {"state": "connected", "epoch": 1, "gateway": "tls://gw:8443", "since": "t0"},
    "spec": {"appliedGeneration": 1, "observedGeneration": 1}, "sections": {}, "gpus": [],
    "holds": {}, "gpuSource": {"name": "fake"}, "journal": {"entries": 0, "unacknowledged": 0},
}


def kubelet_line(kubernetes: dict[str, Any]) -> str:
    lines = render_status(BASE | {"kubernetes": kubernetes}).splitlines()
    return next(line for line in lines if line.startswith("kubelet  "))


def test_registered_with_its_devices() -> None:
    line = kubelet_line({
        "enabled": True, "resourceName": "bcd.dev/gpu", "registered": True, "since": "t1",
        "reason": "registered", "streams": 1, "socket": "/r/bcd-gpu.sock",
        "devices": [{"id": "GPU-0", "health": "Healthy"}, {"id": "GPU-1", "health": "Unhealthy"}],
    })
    assert line == ("kubelet  registered as bcd.dev/gpu since t1; 2 GPUs listed (1 healthy), "
                    "1 ListAndWatch stream(s), plugin socket /r/bcd-gpu.sock")


def test_not_registered_says_why_and_off_says_so() -> None:
    line = kubelet_line({"enabled": True, "resourceName": "bcd.dev/gpu", "registered": False,
                         "reason": "no kubelet socket at /r/kubelet.sock: waiting for the "
                         "kubelet", "devices": [], "streams": 0, "socket": "/r/bcd-gpu.sock"})
    assert line.startswith("kubelet  not registered as bcd.dev/gpu: no kubelet socket at ")
    off = kubelet_line({"enabled": False, "reason": "the pool's policy has no kubernetes: "
                        "nothing is handed to a kubelet"})
    assert off == "kubelet  off: the pool's policy has no kubernetes: nothing is handed to a kubelet"


def test_the_profile_goes_first_and_the_kubernetes_section_is_applied(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl", ec.generate_private_key(ec.SECP256R1()))
    state = NodeState(node_id="node_1", observed_generation=2, desired_sections={
        "devices": {"assignments": []}, "kubernetes": {"resourceName": "bcd.dev/gpu"},
        "profile": {"units": ["dcgm"]}})
    context = ApplyContext(node_id="node_1", epoch=1, time="t", inventory=None,
                           source_error="no source", paths=Paths(tmp_path), devices=unsupported)
    apply_desired(state, journal, context)
    assert list(state.sections) == ["profile", "devices", "kubernetes"]
    assert state.sections["profile"].state == "failed"
    assert state.sections["profile"].message == "dcgm: this bcd does not know the unit; upgrade bcd"
    kubernetes = state.sections["kubernetes"]
    assert (kubernetes.state, kubernetes.generation) == ("applied", 2)
    assert "go to the kubelet as bcd.dev/gpu" in kubernetes.message
