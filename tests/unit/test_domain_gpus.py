"""--gpu-model and --model: a user's spelling read by the one table of GPU models
(domain/gpu_models.py), forgiving in spelling, never one GPU for another."""

from __future__ import annotations

import pytest

from better_compute.domain.errors import InvalidInput
from better_compute.domain.gpu_models import MODELS, model_names
from better_compute.domain.gpus import Gpu, parse_gpu_model


@pytest.mark.parametrize("text,model", [
    ("H100-SXM5-80GB", "H100"),
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("h100", "H100"),
    ("nvidia h100 nvl", "H100"),
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
    ("Tesla T4", "T4"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("rtx-6000-ada", "RTX 6000 Ada"),
    ("RTX_6000_ADA", "RTX 6000 Ada"),
    ("rtx6000ada", "RTX 6000 Ada"),
    ("  RTX   PRO  6000 ", "RTX PRO 6000"),
    ("rtx a6000", "RTX A6000"),
    ("quadro rtx 6000", "Quadro RTX 6000"),
    ("AMD Instinct MI300X", "MI300X"),
    ("mi250x", "MI250X"),
])
def test_a_spelling_reads_as_the_tables_model(text: str, model: str) -> None:
    assert parse_gpu_model(text) == model


def test_every_model_and_every_name_it_goes_by_reads_as_itself() -> None:
    for model in MODELS:
        for spelling in (model.name, *model.aliases, *model.reports):
            assert parse_gpu_model(spelling) == model.name, spelling


@pytest.mark.parametrize("text", ["RTX 6000", "rtx6000", "NVIDIA RTX 6000", "RTX 5000",
                                  "rtx-4000"])
def test_a_spelling_several_gpus_share_is_refused_with_the_choice(text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_gpu_model(text, "--model")
    message = str(err.value)
    assert "could be any of" in message and "--model" in message and " Ada" in message
    assert "RTX PRO" in message


@pytest.mark.parametrize("text", ["H10", "A2000", "GTX 1080", "", "RTX9999", "H1000",
                                  "NVIDIA", "nvidia ;drop", "B40"])
def test_an_unknown_short_name_is_refused_with_the_known_ones_and_the_way_out(text: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_gpu_model(text)
    message = str(err.value)
    assert "names no GPU family" in message and "H100" in message and "RTX 6000 Ada" in message
    assert "the name its driver reports" in message


@pytest.mark.parametrize("text,kept", [
    ("NVIDIA B40", "NVIDIA B40"),
    ("nvidia  H1000 Ultra", "nvidia H1000 Ultra"),
    ("AMD Instinct MI355X", "AMD Instinct MI355X"),
    ("Tesla M60", "Tesla M60"),
    ("GeForce GTX 1080", "GeForce GTX 1080"),
])
def test_an_unknown_gpu_given_by_its_drivers_name_is_kept_as_written(text: str, kept: str
                                                                      ) -> None:
    assert parse_gpu_model(text) == kept


def test_a_gpus_model_comes_from_its_name_then_its_reported_family() -> None:
    assert Gpu(uuid="g", name="NVIDIA RTX 6000 Ada Generation").model == "RTX 6000 Ada"
    assert Gpu(uuid="g", name="Quadro RTX 6000").model == "Quadro RTX 6000"
    # an older bcd's family for the name is the same model; a family of a generic name counts
    assert Gpu(uuid="g", name="NVIDIA RTX A6000", family="RTX A6000").model == "RTX A6000"
    assert Gpu(uuid="g", name="fake", family="h100").model == "H100"
    assert Gpu(uuid="g", name="NVIDIA B40").model == "NVIDIA B40"
    assert Gpu(uuid="g").model is None


def test_a_text_too_long_for_a_gpu_name_is_refused_before_it_is_read() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_gpu_model("NVIDIA " + "H100 " * 100, "--model")
    assert "--model is 506 characters long: a GPU model is at most 128" in str(err.value)


def test_the_error_lists_every_model() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_gpu_model("H10")
    assert all(name in str(err.value) for name in model_names())
