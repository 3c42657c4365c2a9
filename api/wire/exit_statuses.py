"""Exit statuses by stable error code, shared by the CLI and bcd (docs/cli.md, docs/bcd.md).

One status per error class, like gh's, so a script tells "not found" from "try again later"
without reading the message. Standard library only: bcd ships this module.
"""

from __future__ import annotations

ERROR = 1  # any other failure
USAGE = 2  # unknown flags, missing arguments, bad values (invalid_input and its kinds)

BY_CODE = {
    "invalid_input": USAGE,
    "invalid_policy": USAGE,
    "kubernetes_not_enabled": USAGE,
    "ambiguous": USAGE,
    "not_found": 3,
    "unauthenticated": 4,
    "permission_denied": 5,
    "conflict": 6,
    "quota_exceeded": 7,
    "no_capacity": 8,
    "expired": 9,
    "not_initialized": 10,
    "unavailable": 11,
    "rate_limited": 12,
    "fell_behind": 13,
}


def for_code(code: str | None) -> int:
    return BY_CODE.get(code or "", ERROR)
