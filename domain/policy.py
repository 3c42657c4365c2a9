"""A pool's policy: what a joining machine must pass before it takes work, and what runs on it.

Written by people, so unknown fields are rejected with their path.

Two parts configure the pool's nodes (docs/kubernetes.md): ``kubernetes`` turns on bcd's
kubelet device plugin (the resource it advertises held GPUs as, default ``bcd.dev/gpu``),
and ``nodeProfile`` names the units bcd runs on each node (``container-toolkit``: generate
NVIDIA's CDI spec with nvidia-ctk). :func:`node_sections` turns them into the sections of
the nodes' desired state.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from better_compute.domain.errors import PolicyError

ACCEPTANCE_KINDS = ("diag.nvml",)
NODE_UNITS = ("container-toolkit",)
DEFAULT_RESOURCE = "bcd.dev/gpu"
# A Kubernetes extended resource name: a DNS subdomain prefix, a slash, a name part of 63.
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


class AcceptanceCheck(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    kind: Literal["diag.nvml"]


class Expectation(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    gpu_count: int | None = None


class KubernetesPolicy(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Hand the pool's held GPUs to the kubelet through bcd's device plugin."""

    resource_name: str = DEFAULT_RESOURCE


class NodeProfile(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """Units bcd runs on every node of the pool."""

    units: list[Literal["container-toolkit"]] = []


class PoolPolicy(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    acceptance: list[AcceptanceCheck] = []
    expect: Expectation = Expectation()
    kubernetes: KubernetesPolicy | None = None
    node_profile: NodeProfile | None = None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a Kubernetes extended resource name, or None when it can."""
    prefix, slash, rest = name.partition("/")
    if not slash:
        return "it needs a domain and a name, such as bcd.dev/gpu"
    if not prefix or len(prefix) > 253 or not _PREFIX.match(prefix):
        return f"{prefix!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')"
    if not rest or len(rest) > 63 or not _NAME.match(rest):
        return (f"{rest!r} is not a resource name (up to 63 letters, digits, '-', '_' and '.', "
                "alphanumeric at both ends)")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return "the kubernetes.io domain is Kubernetes' own; extended resources use another"
    return None


def parse_policy(raw: bytes | str | dict[str, Any], *, source: str = "the policy") -> PoolPolicy:
    """Decode and check a policy; errors name the field and the fix."""
    try:
        if isinstance(raw, dict):
            policy = msgspec.convert(raw, PoolPolicy)
        else:
            policy = msgspec.json.decode(raw, type=PoolPolicy)
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "$.nodeProfile.units" in message:
            message += f" (node units: {', '.join(NODE_UNITS)})"
        elif "Invalid enumeration value" in message or "kind" in message:
            message += f" (acceptance kinds: {', '.join(ACCEPTANCE_KINDS)})"
        raise PolicyError(f"{source} is not a valid pool policy: {message}") from None
    count = policy.expect.gpu_count
    if count is not None and not 1 <= count <= 64:
        raise PolicyError(
            f"{source}: expect.gpuCount is {count}; set it to the number of GPUs "
            "each machine of the pool has, from 1 to 64"
        )
    if any(c.kind == "diag.nvml" for c in policy.acceptance) and count is None:
        raise PolicyError(
            f"{source}: the diag.nvml acceptance check needs expect.gpuCount, the number of "
            "healthy GPUs a machine must show"
        )
    if policy.kubernetes is not None:
        problem = resource_name_problem(policy.kubernetes.resource_name)
        if problem:
            raise PolicyError(
                f"{source}: kubernetes.resourceName {policy.kubernetes.resource_name!r} is not a "
                f"Kubernetes extended resource name: {problem}. Leave it out for "
                f"{DEFAULT_RESOURCE}"
            )
    if policy.node_profile is not None and \
            len(set(policy.node_profile.units)) != len(policy.node_profile.units):
        raise PolicyError(f"{source}: nodeProfile.units names a unit twice; name each once")
    return policy


def policy_to_dict(policy: PoolPolicy) -> dict[str, Any]:
    """The policy as stored and shown: the optional parts only when set."""
    doc: dict[str, Any] = msgspec.to_builtins(policy)
    for name in ("kubernetes", "nodeProfile"):
        if doc.get(name) is None:
            doc.pop(name, None)
    return doc


def node_sections(policy: Mapping[str, Any]) -> dict[str, Any]:
    """The desired-state sections a pool's policy (as stored) gives each of its nodes.

    ``kubernetes``: ``{"resourceName": …}`` turns on bcd's device plugin; ``profile``:
    ``{"units": [...]}`` the node units. Policies without them give no sections.
    """
    sections: dict[str, Any] = {}
    kubernetes = policy.get("kubernetes")
    if isinstance(kubernetes, Mapping):
        sections["kubernetes"] = {
            "resourceName": str(kubernetes.get("resourceName") or DEFAULT_RESOURCE)}
    profile = policy.get("nodeProfile")
    if isinstance(profile, Mapping) and profile.get("units"):
        sections["profile"] = {"units": [str(unit) for unit in profile["units"]]}
    return sections


def kubernetes_resource(policy: Mapping[str, Any]) -> str | None:
    """The resource name of a pool with ``policy.kubernetes`` (as stored), else None."""
    kubernetes = policy.get("kubernetes")
    if not isinstance(kubernetes, Mapping):
        return None
    return str(kubernetes.get("resourceName") or DEFAULT_RESOURCE)
