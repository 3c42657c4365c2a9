"""GPU family (the pool's ``--gpu-model``) derived from the name a card reports."""

from __future__ import annotations

import re
from functools import cache

# Family names as pools spell them. Matching is by whole token, longest first, so
# "GH200" is not read as "H200", "L40S" not as "L40", "A10G" not as "A10", and
# "H100" never as "H10".
FAMILIES: tuple[str, ...] = (
    # Blackwell
    "GB300",
    "B300",
    "GB200",
    "B200",
    "B100",
    "RTX PRO 6000",
    "RTX PRO 5000",
    "RTX PRO 4500",
    "RTX PRO 4000",
    # Hopper
    "GH200",
    "H200",
    "H100",
    "H800",
    "H20",
    # Ada
    "L40S",
    "L40",
    "L20",
    "L4",
    "L2",
    "RTX 6000 Ada",
    "RTX 5000 Ada",
    "RTX 4000 Ada",
    "RTX 4090",
    "RTX 4080",
    # Ampere
    "A100X",
    "A100",
    "A800",
    "A40",
    "A30",
    "A16",
    "A10G",
    "A10M",
    "A10",
    "A2",
    "RTX A6000",
    "RTX A5000",
    "RTX A4000",
    "RTX 3090",
    # Older data-centre cards
    "V100S",
    "V100",
    "T4",
    "P100",
    "P40",
    "P4",
    "K80",
)

_TOKEN_EDGE = r"[A-Za-z0-9]"


def _pattern(family: str) -> re.Pattern[str]:
    # Spaces inside a family ("RTX 6000 Ada") also match "_" or "-".
    body = r"[\s_-]+".join(re.escape(word) for word in family.split())
    return re.compile(rf"(?<!{_TOKEN_EDGE}){body}(?!{_TOKEN_EDGE})", re.IGNORECASE)


@cache
def _patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    ordered = sorted(FAMILIES, key=len, reverse=True)
    return tuple((family, _pattern(family)) for family in ordered)


def gpu_family(name: str | None) -> str | None:
    """Return the family of a GPU name, or None when the name is not a known card.

    >>> gpu_family("NVIDIA H100 80GB HBM3"), gpu_family("H100-SXM5-80GB")
    ('H100', 'H100')
    """
    if not name:
        return None
    for family, pattern in _patterns():
        if pattern.search(name):
            return family
    return None
