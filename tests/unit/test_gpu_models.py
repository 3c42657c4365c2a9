"""domain/gpu_models.py: the ONE table of GPU models, read the same way by the control plane
(a pool's model, the placer, the server's diag.nvml) and by bcd (the family it reports, its
own diag.nvml)."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from better_compute.agent.gpu import Gpu as WireGpu
from better_compute.agent.gpu import Inventory
from better_compute.agent.gpu.model import HostFacts
from better_compute.agent.node.diag import diag_nvml as bcd_diag_nvml
from better_compute.api.wire.gpu_family import FAMILIES, gpu_family
from better_compute.domain.gpu_models import (
    AMBIGUOUS,
    LEGACY,
    MODELS,
    _known,
    card_model,
    known_model,
    same_model,
    stored_model,
)
from better_compute.domain.gpus import parse_gpu_model
from better_compute.domain.node_rules import acceptance_checks, diag_nvml
from better_compute.domain.placement import FreeGpu, PlacementRequest, gpu_attributes
from better_compute.domain.selectors import parse_selector

SIX_THOUSANDS = {"NVIDIA RTX 6000 Ada Generation": "RTX 6000 Ada",
                 "NVIDIA RTX PRO 6000 Blackwell Server Edition": "RTX PRO 6000",
                 "NVIDIA RTX A6000": "RTX A6000", "Quadro RTX 6000": "Quadro RTX 6000"}


def test_no_spelling_names_two_models() -> None:
    """Each spelling's letters and digits (what matching compares) belong to one model."""
    owners: dict[str, set[str]] = {}
    for model in MODELS:
        for spelling in (model.name, *model.aliases, *model.reports):
            owners.setdefault(re.sub(r"[^A-Z0-9]", "", spelling.upper()), set()).add(model.name)
    assert {key: names for key, names in owners.items() if len(names) > 1} == {}
    assert not set(owners) & {re.sub(r"[^A-Z0-9]", "", s.upper()) for s in AMBIGUOUS}


def test_no_two_models_collapse_into_one() -> None:
    for a, b in itertools.combinations(MODELS, 2):
        assert not same_model(a.name, b.name), (a.name, b.name)


@pytest.mark.parametrize("name,model", sorted(SIX_THOUSANDS.items()))
def test_the_four_rtx_6000_cards_are_four_models(name: str, model: str) -> None:
    assert card_model(name) == model
    others = [m for m in SIX_THOUSANDS.values() if m != model]
    assert not any(same_model(card_model(name), other) for other in others)


@pytest.mark.parametrize("name,model", [
    ("NVIDIA GH200 480GB", "GH200"), ("NVIDIA H200 NVL", "H200"), ("NVIDIA H20", "H20"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA L40", "L40"), ("NVIDIA L4", "L4"),
    ("NVIDIA A10G", "A10G"), ("NVIDIA A10", "A10"), ("NVIDIA A100X", "A100X"),
    ("Tesla V100S-PCIE-32GB", "V100S"), ("Tesla V100-SXM2-32GB", "V100"),
    ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA H100 NVL", "H100"), ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"), ("NVIDIA GeForce RTX 4090", "RTX 4090"),
])
def test_a_model_is_read_from_whole_tokens_only(name: str, model: str) -> None:
    assert card_model(name) == model


@pytest.mark.parametrize("name", ["NVIDIA H1000", "NVIDIA H10", "NVIDIA RTX A2000",
                                  "NVIDIA GH100X", "Matrox G200eR2", "NVIDIA RTX 6000"])
def test_an_unknown_card_is_its_own_model_never_a_known_one(name: str) -> None:
    assert known_model(name) is None
    assert card_model(name) == name
    assert not any(same_model(name, m.name) for m in MODELS)


def test_unknown_names_match_by_case_spacing_and_the_vendor_word_only() -> None:
    assert same_model("NVIDIA B40", "nvidia  b40")
    assert same_model("NVIDIA B40", "B40") and same_model("NVIDIA B40", "b-40")
    assert not same_model("NVIDIA B40", "NVIDIA B40 Max-Q")
    assert not same_model("NVIDIA B40", None) and not same_model(None, None)


def test_long_names_are_read_but_never_cached() -> None:
    long_name = "NVIDIA H100 " + "x" * 200
    before = _known.cache_info().currsize
    assert known_model(long_name) is None and card_model(long_name) == long_name
    assert not same_model(long_name, "H100")
    assert _known.cache_info().currsize == before


def test_two_models_in_one_name_are_no_model() -> None:
    assert known_model("H100 or A100") is None


def test_the_wire_and_bcd_read_the_domains_table() -> None:
    """One table: what bcd reports as a card's family is the domain's model for it."""
    assert tuple(m.name for m in MODELS) == FAMILIES
    for model in MODELS:
        for name in model.reports:
            assert WireGpu(index=0, uuid="GPU-1", name=name).family == model.name
            assert gpu_family(name) == card_model(name) == parse_gpu_model(name) == model.name


def test_legacy_names_read_as_todays_model_only_where_stored() -> None:
    assert LEGACY == {"RTX6000": "RTX 6000 Ada"}
    assert stored_model("RTX6000") == "RTX 6000 Ada" and stored_model("H100") == "H100"
    assert stored_model(None) is None
    assert "RTX 6000" in AMBIGUOUS  # a user's "RTX6000" is refused, not read as the Ada
    assert card_model("NVIDIA RTX 6000") == "NVIDIA RTX 6000"


def gpus(name: str, count: int = 4, family: str | None = None) -> list[dict[str, Any]]:
    return [{"uuid": f"GPU-{i}", "index": i, "name": name, "healthy": True,
             "family": family if family is not None else WireGpu(index=i, uuid="u", name=name).family}
            for i in range(count)]


def inventory(name: str, count: int = 4) -> Inventory:
    return Inventory(host=HostFacts(), source="fake",
                     gpus=[WireGpu(index=i, uuid=f"GPU-{i}", name=name) for i in range(count)])


@pytest.mark.parametrize("spelling", ["RTX 6000 Ada", "rtx-6000-ada",
                                      "NVIDIA RTX 6000 Ada Generation"])
def test_server_and_bcd_accept_a_node_of_the_pools_model(spelling: str) -> None:
    policy = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 4}}
    [check] = acceptance_checks(policy, parse_gpu_model(spelling))
    ada = "NVIDIA RTX 6000 Ada Generation"
    assert diag_nvml(check["expect"], gpus(ada)) == (True, "4 healthy RTX 6000 Ada GPUs "
                                                           "(expected 4)")
    assert bcd_diag_nvml(check["expect"], inventory(ada)).passed
    for other in ("NVIDIA RTX A6000", "Quadro RTX 6000",
                  "NVIDIA RTX PRO 6000 Blackwell Server Edition"):
        assert not diag_nvml(check["expect"], gpus(other))[0]
        result = bcd_diag_nvml(check["expect"], inventory(other))
        assert not result.passed and "not RTX 6000 Ada" in result.message


def test_bcd_accepts_an_unknown_gpu_for_a_pool_of_its_drivers_name() -> None:
    expect = {"gpuCount": 2, "gpuModel": parse_gpu_model("NVIDIA B40")}
    assert bcd_diag_nvml(expect, inventory("NVIDIA B40", 2)).passed
    assert diag_nvml(expect, gpus("NVIDIA B40", 2))[0]
    assert not bcd_diag_nvml(expect, inventory("NVIDIA B40 Max-Q", 2)).passed


def free(name: str, model: str | None = None) -> FreeGpu:
    attributes = gpu_attributes(gpus(name, 1)[0])
    if model is not None:  # a row an older version wrote
        attributes["model"] = model
    return FreeGpu("GPU-0", 0, attributes)


def test_the_placer_matches_a_request_by_the_tables_model() -> None:
    ada, quadro = "NVIDIA RTX 6000 Ada Generation", "Quadro RTX 6000"
    assert free(ada).attributes["model"] == "RTX 6000 Ada"
    wanted = PlacementRequest(gpus=1, model="RTX 6000 Ada")
    assert wanted.qualifies(free(ada)) and not wanted.qualifies(free(quadro))
    # a reservation stored with the old compact name asks for the Ada, not the Quadro
    legacy = PlacementRequest(gpus=1, model="RTX6000")
    assert legacy.model == "RTX 6000 Ada"
    assert legacy.qualifies(free(ada)) and not legacy.qualifies(free(quadro))
    # a free-GPU row written before one table ("RTX6000" for the Quadro) is read by its name
    assert not wanted.qualifies(free(quadro, model="RTX6000"))
    assert PlacementRequest(gpus=1, model="Quadro RTX 6000").qualifies(free(quadro, "RTX6000"))


@pytest.mark.parametrize("selector,matches", [
    ("model == 'RTX 6000 Ada'", True), ("model == 'rtx-6000-ada'", True),
    ("model in ['h100', 'RTX 6000 Ada Generation']", True), ("model != 'RTX A6000'", True),
    ("model == 'RTX A6000'", False), ("model == 'RTX 6000'", False),
    ("name == 'NVIDIA RTX 6000 Ada Generation'", True), ("name == 'nvidia rtx 6000 ada generation'",
                                                         False),
])
def test_a_selectors_model_literal_is_read_by_the_table(selector: str, matches: bool) -> None:
    """Only ``model`` literals are read by the table; other strings compare as written."""
    attributes = gpu_attributes(gpus("NVIDIA RTX 6000 Ada Generation", 1)[0])
    assert parse_selector(selector).matches(attributes) is matches
