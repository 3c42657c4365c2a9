"""Exit statuses, one per error class (docs/cli.md, "Exit statuses"), like gh's.

A script tells "not found" from "try again later" without reading the message; the stable
code is also on standard error: ``error [no_capacity]: …``. The table is shared with bcd
(api/wire/exit_statuses.py).
"""

from __future__ import annotations

from better_compute.api.wire.exit_statuses import BY_CODE, ERROR, USAGE
from better_compute.api.wire.exit_statuses import for_code as _for_code

__all__ = ["BY_CODE", "ERROR", "INTERRUPTED", "OK", "USAGE", "for_code"]

OK = 0
INTERRUPTED = 130  # Ctrl-C; SIGTERM ends with 143


def for_code(code: str) -> int:
    return _for_code(code)
