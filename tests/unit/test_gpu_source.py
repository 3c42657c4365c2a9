"""agent/gpu/source.py: picking a GPU source from BCD_GPU_SOURCE."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from better_compute.agent.gpu import (
    FakeSource,
    GpuSourceError,
    GpuSourceUnavailable,
    NvidiaSmiSource,
    nvml,
    open_source,
    smi,
    write_fake_fleet_file,
)


class Sentinel:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


def _nvml_raises(error: GpuSourceError) -> type:
    class Failing:
        def __init__(self, **kwargs: Any) -> None:
            raise error

    return Failing


def test_fake_spec_opens_the_file(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    write_fake_fleet_file(path, gpus=3)
    opened = open_source(f"fake:{path}")
    assert isinstance(opened, FakeSource)
    assert len(opened.inventory().gpus) == 3


@pytest.mark.parametrize(("spec", "match"), [("fake:", "needs a file"), ("cuda", "one of: nvml")])
def test_bad_specs_are_refused(spec: str, match: str) -> None:
    with pytest.raises(GpuSourceError, match=match):
        open_source(spec)


def test_named_sources_get_the_host_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NvmlSource", Sentinel)
    monkeypatch.setattr(smi, "NvidiaSmiSource", Sentinel)
    for spec in ("nvml", " nvml ", "nvidia-smi"):
        opened = open_source(spec, host_root="/h")
        assert isinstance(opened, Sentinel) and opened.kwargs == {"host_root": "/h"}


def test_default_prefers_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NvmlSource", Sentinel)
    assert isinstance(open_source(None), Sentinel)
    assert isinstance(open_source(""), Sentinel)


def test_default_falls_back_to_nvidia_smi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NvmlSource", _nvml_raises(GpuSourceUnavailable("no libnvidia-ml")))
    # source.py and smi.py both look nvidia-smi up with shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert isinstance(open_source(None), NvidiaSmiSource)


def test_default_with_nothing_installed_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NvmlSource", _nvml_raises(GpuSourceUnavailable("no libnvidia-ml")))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(GpuSourceUnavailable) as caught:
        open_source(None)
    message = str(caught.value)
    assert "no libnvidia-ml" in message
    assert "install the NVIDIA driver" in message
    assert "BCD_GPU_SOURCE=fake:FILE" in message


def test_a_failing_nvml_is_not_hidden_by_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "NvmlSource", _nvml_raises(GpuSourceError("NVML: version mismatch")))
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    with pytest.raises(GpuSourceError, match="version mismatch"):
        open_source(None)
