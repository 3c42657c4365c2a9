"""policy.kubernetes and policy.nodeProfile: checked with their path, shown as stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from better_compute.domain.errors import PolicyError
from better_compute.domain.policy import (
    kubernetes_resource,
    node_sections,
    parse_policy,
    policy_to_dict,
)

TUTORIAL = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}


def test_an_empty_kubernetes_object_means_the_default_resource() -> None:
    doc = policy_to_dict(parse_policy({**TUTORIAL, "kubernetes": {}}))
    assert doc == {**TUTORIAL, "kubernetes": {"resourceName": "bcd.dev/gpu"}}
    assert kubernetes_resource(doc) == "bcd.dev/gpu"
    assert node_sections(doc) == {"kubernetes": {"resourceName": "bcd.dev/gpu"}}


def test_a_policy_without_them_is_stored_as_before() -> None:
    doc = policy_to_dict(parse_policy(json.dumps(TUTORIAL)))
    assert doc == TUTORIAL
    assert kubernetes_resource(doc) is None and node_sections(doc) == {}


def test_the_container_toolkit_unit() -> None:
    doc = policy_to_dict(parse_policy({"nodeProfile": {"units": ["container-toolkit"]}}))
    assert doc["nodeProfile"] == {"units": ["container-toolkit"]}
    assert node_sections(doc) == {"profile": {"units": ["container-toolkit"]}}
    # An empty profile runs nothing and sends no section.
    assert node_sections(policy_to_dict(parse_policy({"nodeProfile": {}}))) == {}


@pytest.mark.parametrize("name", ["bcd.dev/gpu", "example.com/h100", "a.b-c.io/GPU_1.x"])
def test_extended_resource_names(name: str) -> None:
    policy = parse_policy({"kubernetes": {"resourceName": name}})
    assert policy.kubernetes is not None and policy.kubernetes.resource_name == name


@pytest.mark.parametrize("doc,needles", [
    ({"kubernetes": {"resource": "bcd.dev/gpu"}}, ["unknown field `resource`", "$.kubernetes"]),
    ({"kubernetes": {"resourceName": "gpu"}}, ["kubernetes.resourceName 'gpu'",
                                               "such as bcd.dev/gpu"]),
    ({"kubernetes": {"resourceName": "kubernetes.io/gpu"}}, ["kubernetes.io domain"]),
    ({"kubernetes": {"resourceName": "Example.com/gpu"}}, ["not a DNS subdomain"]),
    ({"kubernetes": {"resourceName": "bcd.dev/-gpu"}}, ["not a resource name"]),
    ({"kubernetes": {"resourceName": "bcd.dev/" + "g" * 64}}, ["up to 63"]),
    ({"kubernetes": True}, ["$.kubernetes"]),
    ({"nodeProfile": {"units": ["docker"]}}, ["$.nodeProfile.units[0]",
                                              "node units: container-toolkit"]),
    ({"nodeProfile": {"unit": ["container-toolkit"]}}, ["unknown field `unit`",
                                                        "$.nodeProfile"]),
    ({"nodeProfile": {"units": ["container-toolkit", "container-toolkit"]}}, ["twice"]),
])
def test_mistakes_are_named_with_their_field(doc: dict[str, Any],
                                             needles: list[str]) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(doc, source="pool-policy.json")
    assert str(err.value).startswith("pool-policy.json")
    for needle in needles:
        assert needle in str(err.value)
