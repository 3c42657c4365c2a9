"""Pool policies: written by people, so every mistake is named with its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from better_compute.domain.errors import InvalidInput, PolicyError
from better_compute.domain.policy import PoolPolicy, parse_policy, policy_to_dict

TUTORIAL = '{\n  "acceptance": [{ "kind": "diag.nvml" }],\n  "expect": { "gpuCount": 8 }\n}\n'


def test_the_tutorials_policy_file() -> None:
    policy = parse_policy(TUTORIAL)
    assert [c.kind for c in policy.acceptance] == ["diag.nvml"]
    assert policy.expect.gpu_count == 8
    assert policy_to_dict(policy) == json.loads(TUTORIAL)


def test_bytes_str_and_dict_decode_alike() -> None:
    as_dict = json.loads(TUTORIAL)
    assert parse_policy(TUTORIAL.encode()) == parse_policy(TUTORIAL) == parse_policy(as_dict)


def test_an_empty_policy_accepts_without_checks() -> None:
    assert parse_policy("{}") == PoolPolicy()
    assert policy_to_dict(parse_policy("{}")) == {"acceptance": [], "expect": {"gpuCount": None}}


@pytest.mark.parametrize("doc,needles", [
    ({"acceptance": [], "colour": 1}, ["unknown field `colour`"]),
    ({"expect": {"gpuCount": 8, "gpuModel": "H100"}}, ["unknown field `gpuModel`", "$.expect"]),
    ({"acceptance": [{"kind": "diag.nvml", "timeout": 3}], "expect": {"gpuCount": 8}},
     ["unknown field `timeout`", "$.acceptance[0]"]),
    ({"expect": {"gpu_count": 8}}, ["unknown field `gpu_count`"]),
])
def test_unknown_fields_are_named_with_their_path(doc: dict[str, Any],
                                                  needles: list[str]) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(json.dumps(doc), source="pool-policy.json")
    for needle in needles:
        assert needle in str(err.value)
    assert str(err.value).startswith("pool-policy.json")


@pytest.mark.parametrize("kind", ["diag.foo", "nvml", "", "DIAG.NVML"])
def test_unknown_acceptance_kinds_list_the_known_ones(kind: str) -> None:
    with pytest.raises(PolicyError, match=r"acceptance kinds: diag\.nvml"):
        parse_policy({"acceptance": [{"kind": kind}], "expect": {"gpuCount": 8}})


@pytest.mark.parametrize("count", [1, 8, 64])
def test_gpu_count_in_range(count: int) -> None:
    policy = parse_policy({"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": count}})
    assert policy.expect.gpu_count == count


@pytest.mark.parametrize("count,needle", [
    (0, "gpuCount is 0"), (65, "gpuCount is 65"), (-8, "gpuCount is -8"),
    ("8", "$.expect.gpuCount"), (True, "$.expect.gpuCount"), (8.5, "$.expect.gpuCount"),
])
def test_gpu_count_out_of_range_or_of_the_wrong_type(count: object, needle: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy({"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": count}})
    assert needle in str(err.value)


def test_diag_nvml_needs_a_gpu_count() -> None:
    with pytest.raises(PolicyError, match=r"needs expect\.gpuCount"):
        parse_policy({"acceptance": [{"kind": "diag.nvml"}]})


def test_policy_errors_are_invalid_input_with_their_own_code() -> None:
    with pytest.raises(InvalidInput) as err:
        parse_policy("[]")
    assert err.value.code == "invalid_policy"
