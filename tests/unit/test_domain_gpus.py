"""--gpu-model is the family a card's name belongs to."""

from __future__ import annotations

import pytest

from better_compute.domain.errors import InvalidInput
from better_compute.domain.gpus import FAMILIES, gpu_family, parse_gpu_model


@pytest.mark.parametrize("name,family", [
    ("H100-SXM5-80GB", "H100"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("h100", "H100"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA GB200", "GB200"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA A100-SXM4-40GB", "A100"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX6000"),
    ("Tesla T4", "T4"),
])
def test_family_from_a_cards_name(name: str, family: str) -> None:
    assert gpu_family(name) == family
    assert parse_gpu_model(name) == family


@pytest.mark.parametrize("name", ["H10", "A2000", "GeForce GTX 1080", "", "RTX9999", "H1000"])
def test_names_of_no_known_family(name: str) -> None:
    assert gpu_family(name) is None
    with pytest.raises(InvalidInput) as err:
        parse_gpu_model(name)
    assert "names no GPU family" in str(err.value) and "H100" in str(err.value)


def test_every_family_is_its_own_family() -> None:
    for family in FAMILIES:
        assert gpu_family(family) == family
