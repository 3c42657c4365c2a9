"""What one tenant may hold at once, read once by the composition root (api/runtime.py).

Each bound is a server setting (docs/configuration.md) and a row of docs/security.md's
"Bounds"; 0 turns one off. The services read them from ``ComputeService.limits``: one value,
not a default threaded through every constructor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from better_compute.api.settings import env_count

MAX_QUEUED = 100  # queued reservations of one tenant in one pool (reservations.max_queued)
MAX_TOKENS_PER_TENANT = 1000  # live API tokens of one tenant (tokens.max_per_tenant; root: none)


@dataclass(frozen=True)
class ServiceLimits:
    max_queued: int = MAX_QUEUED
    max_tokens_per_tenant: int = MAX_TOKENS_PER_TENANT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None) -> ServiceLimits:
        """The settings as the server's environment gives them (a bad one: InvalidInput
        naming the variable)."""
        return cls(
            max_queued=env_count(env, "BETTER_COMPUTE_RESERVATIONS_MAX_QUEUED", MAX_QUEUED),
            max_tokens_per_tenant=env_count(env, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT",
                                            MAX_TOKENS_PER_TENANT),
        )
