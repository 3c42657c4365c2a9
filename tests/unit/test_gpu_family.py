"""agent/gpu/family.py: the pool's GPU model derived from the name a card reports."""

from __future__ import annotations

import pytest

from better_compute.agent.gpu import Gpu, gpu_family
from better_compute.agent.gpu.family import FAMILIES


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("H100-SXM5-80GB", "H100"),
        ("NVIDIA H100 PCIe", "H100"),
        ("NVIDIA H100 NVL", "H100"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H200 NVL", "H200"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", "GB200"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("Tesla T4", "T4"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000"),
        ("nvidia h100 80gb hbm3", "H100"),
    ],
)
def test_family_from_name(name: str, family: str) -> None:
    assert gpu_family(name) == family


@pytest.mark.parametrize("name", ["", None, "NVIDIA H10", "Matrox G200eR2", "HBM3", "H1000"])
def test_unknown_names_have_no_family(name: str | None) -> None:
    assert gpu_family(name) is None


def test_longer_family_wins_over_its_prefix() -> None:
    # Every family that another one contains (L4 in L40S, H20 in H200) must be
    # told apart from it, whichever order FAMILIES lists them in.
    for family in FAMILIES:
        assert gpu_family(f"NVIDIA {family}") == family


def test_gpu_derives_family_and_product_unless_given() -> None:
    derived = Gpu(index=0, uuid="GPU-1", name="NVIDIA L40S")
    given = Gpu(index=0, uuid="GPU-1", name="NVIDIA L40S", product="900-2G133-0080-000", family="X")
    assert (derived.family, derived.product) == ("L40S", "NVIDIA L40S")
    assert (given.family, given.product) == ("X", "900-2G133-0080-000")
