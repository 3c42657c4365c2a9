"""The committed kubelet stubs are exactly what scripts/gen-kubelet-api makes of api.proto.

So nobody edits a generated file by hand, and a change of the proto or of the pinned
grpcio-tools version cannot land without the stubs regenerated beside it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STUBS = ("api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi")


def test_regenerating_the_stubs_gives_the_committed_files(tmp_path: Path) -> None:
    done = subprocess.run([str(ROOT / "scripts/gen-kubelet-api"), str(tmp_path)], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name in STUBS:
        committed = (ROOT / "agent/kubelet" / name).read_text()
        assert (tmp_path / name).read_text() == committed, (
            f"agent/kubelet/{name} differs from what scripts/gen-kubelet-api generates: run "
            "it and commit the result (never edit the stubs by hand)")


def test_the_stubs_speak_the_kubelets_v1beta1_services() -> None:
    from better_compute.agent.kubelet import api_pb2, api_pb2_grpc

    services = api_pb2.DESCRIPTOR.services_by_name
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert sorted(services) == ["DevicePlugin", "Registration"]
    assert sorted(services["DevicePlugin"].methods_by_name) == [
        "Allocate", "GetDevicePluginOptions", "GetPreferredAllocation", "ListAndWatch",
        "PreStartContainer"]
    assert "cdi_devices" in api_pb2.ContainerAllocateResponse.DESCRIPTOR.fields_by_name
    assert hasattr(api_pb2_grpc, "DevicePluginServicer") and hasattr(api_pb2_grpc,
                                                                   "RegistrationStub")
