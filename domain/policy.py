"""A pool's policy: what a joining machine must pass before it takes work.

Written by people, so unknown fields are rejected with their path.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from better_compute.domain.errors import PolicyError

ACCEPTANCE_KINDS = ("diag.nvml",)


class AcceptanceCheck(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    kind: Literal["diag.nvml"]


class Expectation(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    gpu_count: int | None = None


class PoolPolicy(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    acceptance: list[AcceptanceCheck] = []
    expect: Expectation = Expectation()


def parse_policy(raw: bytes | str | dict[str, Any], *, source: str = "the policy") -> PoolPolicy:
    """Decode and check a policy; errors name the field and the fix."""
    try:
        if isinstance(raw, dict):
            policy = msgspec.convert(raw, PoolPolicy)
        else:
            policy = msgspec.json.decode(raw, type=PoolPolicy)
    except msgspec.DecodeError as exc:
        message = str(exc)
        if "Invalid enumeration value" in message or "kind" in message:
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
    return policy


def policy_to_dict(policy: PoolPolicy) -> dict[str, Any]:
    return msgspec.to_builtins(policy)  # type: ignore[no-any-return]
