"""Free text from callers: names, regions, reasons. Bounded, one line, no hidden characters.

Every free-text field a caller sets is stored in an event, copied into read
models and shown to other people (tables, logs, terminals). So each is capped
in length (``MAX_NAME`` and friends; docs/security.md, "Bounds") and refuses
control characters (NUL, newlines, escapes), format characters (the bidi
overrides and isolates such as U+202E RIGHT-TO-LEFT OVERRIDE, zero-width
characters), lone surrogates and line or paragraph separators: they hide or
reorder what a reader sees (the one rule: domain/visible.py, which also escapes
them wherever a person reads text). Ordinary letters of every script, spaces,
punctuation and symbols are fine.
"""

from __future__ import annotations

import unicodedata

from better_compute.domain.errors import InvalidInput
from better_compute.domain.visible import hidden_character

MAX_NAME = 200  # names of tenants, tokens, sites, pools
MAX_REGION = 64
MAX_REASON = 500  # reasons given for an operator's action (cordon, adopt)
MAX_STRING = 65_536  # any other string of any params (the RPC layer's backstop)

__all__ = ["MAX_NAME", "MAX_REASON", "MAX_REGION", "MAX_STRING", "check_name", "check_reason",
           "check_text", "describe_character", "hidden_character"]


def describe_character(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X}" + (f" {name}" if name else "")


def check_text(text: str, what: str, max_length: int, *, example: str = "") -> str:
    """``text`` when it is at most ``max_length`` characters of visible one-line text."""
    if len(text) > max_length:
        raise InvalidInput(
            f"{what} of {len(text)} characters is too long: use at most {max_length} "
            f"characters{f' (for example {example})' if example else ''}",
            data={"length": len(text), "max": max_length},
        )
    char = hidden_character(text)
    if char is not None:
        raise InvalidInput(
            f"{what} contains the character {describe_character(char)}: use one line of "
            "visible text, without control, bidi-override or zero-width characters",
            data={"character": f"U+{ord(char):04X}"},
        )
    return text


def check_name(text: str | None, what: str = "--name") -> str | None:
    """A name of a tenant, token, site or pool (None and "" pass: the default name)."""
    return None if text is None else check_text(text, what, MAX_NAME)


def check_reason(text: str | None, what: str = "--reason") -> str | None:
    return None if text is None else check_text(text, what, MAX_REASON)
