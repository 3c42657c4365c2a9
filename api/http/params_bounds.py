"""Bounds every JSON-RPC method's params meet before any method sees them.

A backstop for every method, also for params added later: however a method
checks its own fields (names, keys, durations: domain/), no decoded param
holds a string longer than ``MAX_STRING`` characters (``MAX_SEALED`` for the
sealed join request), a control, bidi-override or zero-width character
(domain/text.py), an integer outside ``MIN_INT..MAX_INT``, more than
``MAX_ITEMS`` items in one list or object, or more than ``MAX_DEPTH`` levels
of nesting. The request body itself is at most 1 MiB (api/http/http_limits.py).
docs/security.md, "Bounds", lists them all.
"""

from __future__ import annotations

from typing import Any

import msgspec

from better_compute.domain.errors import InvalidInput
from better_compute.domain.text import MAX_STRING, describe_character, hidden_character

MAX_SEALED = 256 * 1024  # nodes.join's sealed request: a CSR and the hardware facts
MAX_DEPTH = 16
MAX_ITEMS = 1000
MAX_INT = 2**53 - 1  # what every JSON reader holds exactly
MIN_INT = -MAX_INT
_LONG_FIELDS = {"sealed": MAX_SEALED}


def check_params(method: str, params: Any) -> None:
    """Refuse params of ``method`` that pass a bound, naming the path of the value."""
    _check(method, params, "$", 0, MAX_STRING)


def _refuse(method: str, path: str, problem: str) -> InvalidInput:
    return InvalidInput(f"invalid params for {method}: {path} {problem}",
                        data={"path": path})


def _check(method: str, value: Any, path: str, depth: int, max_string: int) -> None:
    if depth > MAX_DEPTH:
        raise _refuse(method, path, f"nests more than {MAX_DEPTH} levels deep")
    if isinstance(value, str):
        if len(value) > max_string:
            raise _refuse(method, path, f"has {len(value)} characters: strings are at most "
                                        f"{max_string} characters")
        char = hidden_character(value)
        if char is not None:
            raise _refuse(method, path, f"contains the character {describe_character(char)}: "
                                        "use visible text without control, bidi-override or "
                                        "zero-width characters")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not MIN_INT <= value <= MAX_INT:
            raise _refuse(method, path, f"is a number of {len(str(abs(value)))} digits: "
                                        f"numbers are at most {MAX_INT:,} in magnitude")
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise _refuse(method, path, "is not a finite number")
    elif isinstance(value, msgspec.Struct):
        for name in value.__struct_fields__:
            _check(method, getattr(value, name), f"{path}.{name}", depth + 1,
                   _LONG_FIELDS.get(name, max_string))
    elif isinstance(value, dict):
        if len(value) > MAX_ITEMS:
            raise _refuse(method, path, f"has {len(value)} members: at most {MAX_ITEMS}")
        for key, item in value.items():
            _check(method, key, f"{path} (a key)", depth + 1, max_string)
            _check(method, item, f"{path}.{key}" if len(str(key)) <= 64 else f"{path}.…",
                   depth + 1, max_string)
    elif isinstance(value, list | tuple):
        if len(value) > MAX_ITEMS:
            raise _refuse(method, path, f"has {len(value)} items: at most {MAX_ITEMS}")
        for index, item in enumerate(value):
            _check(method, item, f"{path}[{index}]", depth + 1, max_string)
