"""Exit statuses, one per error class (docs/cli.md, "Exit statuses"), like gh's.

A script tells "not found" from "try again later" without reading the message; the stable
code is also on standard error: ``error [no_capacity]: …``.
"""

from __future__ import annotations

OK = 0
ERROR = 1  # any other failure
USAGE = 2  # unknown flags, missing arguments, bad values (invalid_input, invalid_policy)
INTERRUPTED = 130  # Ctrl-C; SIGTERM ends with 143

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


def for_code(code: str) -> int:
    return BY_CODE.get(code, ERROR)
