"""Numbers that operators (and tests) tune through the environment."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from better_compute.domain.durations import parse_duration
from better_compute.domain.errors import InvalidInput


def env_seconds(env: Mapping[str, str] | None, name: str, default: float) -> float:
    """``name`` from ``env`` as seconds (``30``, ``0.5``, ``30s``, ``10m``), else ``default``."""
    text = (env or {}).get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text) if text[-1].isdigit() else parse_duration(text).total_seconds()
    except (ValueError, InvalidInput):
        raise InvalidInput(f"{name}={text!r} is not a number of seconds or a duration "
                           "(for example 30, 30s or 10m)") from None
    if value <= 0:
        raise InvalidInput(f"{name}={text!r} must be more than 0")
    return value


def env_count(env: Mapping[str, str] | None, name: str, default: int) -> int:
    """``name`` from ``env`` as a whole number, 0 or more, else ``default``."""
    text = (env or {}).get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or len(text) > 9:
        raise InvalidInput(f"{name}={text!r} is not a whole number from 0 to 999999999 "
                           "(0: no bound)")
    return int(text)


def env_networks(env: Mapping[str, str] | None, name: str, key: str) -> list[str]:
    """``name`` from ``env``: addresses and networks (``10.0.0.5``, ``10.0.0.0/8``, ``::1``)
    separated by commas, or ``*`` for every address; [] when unset."""
    text = (env or {}).get(name, "").strip()
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if item == "*":
            continue
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise InvalidInput(
                f"{key} ({name}): {item!r} is not an IP address or network; give addresses "
                "and networks separated by commas (10.0.0.5, 10.0.0.0/8, fd00::/8), or * "
                "for every peer") from None
    return items
