"""One readable line per event, for a person at a terminal (`events watch`, `nodes events`).

``12:04:05  #42  reservation.placed  rsv_…  4 GPUs on node_…`` : the time (local), the
sequence, the type, the subject and a short summary of the data, coloured by kind (green
for what went well, yellow for what ended or paused, red for what failed). Piped output stays
one JSON line per event; see docs/cli.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from better_compute.domain.visible import visible

SUMMARY_WIDTH = 72

_GOOD = ("created", "joined", "connected", "adopted", "placed", "active", "healthy", "offered",
         "uncordoned", "passed", "bound", "renewed")
_ENDED = ("released", "cancelled", "disconnected", "cordoned", "revoked", "expired", "ended",
          "unassigned", "replaced")
_BAD = ("failed", "unhealthy", "unreachable", "rejected", "timedout")
_COLOURS = {"good": "\x1b[32m", "ended": "\x1b[33m", "bad": "\x1b[31m"}
_RESET = "\x1b[0m"


def kind(event_type: str) -> str | None:
    last = event_type.rsplit(".", 1)[-1].replace("_", "").replace("-", "").lower()
    for name, words in (("bad", _BAD), ("ended", _ENDED), ("good", _GOOD)):
        if last in words:
            return name
    return None


def _gpus(data: Mapping[str, Any]) -> str:
    gpus = data.get("gpus")
    count = len(gpus) if isinstance(gpus, list) else data.get("gpuCount")
    return f"{count} GPU{'s' if count != 1 else ''}" if count is not None else ""


def _on_node(data: Mapping[str, Any]) -> str:
    return f" on {data['nodeId']}" if data.get("nodeId") else ""


_SUMMARIES: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "reservation.placed": lambda d: f"{_gpus(d)}{_on_node(d)}",
    "reservation.replaced": lambda d: f"{d.get('reason', '')}: {_gpus(d)}{_on_node(d)}",
    "reservation.binding": lambda d: f"hold sent{_on_node(d)}",
    "reservation.active": lambda d: f"bound{_on_node(d.get('binding') or {})}",
    "reservation.released": lambda d: f"{d.get('reason', 'released')}{_on_node(d)}",
    "node.joined": lambda d: f"{_gpus(d)}, pool {d.get('poolId', '')}",
    "node.connected": lambda d: f"session epoch {d.get('epoch', '')}",
    "node.adopted": lambda d: f"generation {d.get('generation', '')}",
}


def _scalars(data: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in data.items()
                    if isinstance(v, str | int | float | bool) and k not in ("at", "by"))


def summary(doc: Mapping[str, Any]) -> str:
    """The data in a few words, every hidden character escaped (domain/visible.py)."""
    data = doc.get("data") or {}
    special = _SUMMARIES.get(str(doc.get("type")))
    text = visible(special(data) if special else _scalars(data))
    return text if len(text) <= SUMMARY_WIDTH else text[:SUMMARY_WIDTH - 1] + "…"


def clock(text: Any) -> str:
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00")).astimezone().strftime(
            "%H:%M:%S")
    except ValueError:
        return str(text or "")


def line(doc: Mapping[str, Any], *, colour: bool = False) -> str:
    event_type = visible(str(doc.get("type", "")))
    shown = event_type
    tint = _COLOURS.get(kind(event_type) or "") if colour else None
    if tint:
        shown = f"{tint}{event_type}{_RESET}"
    pad = " " * max(0, 28 - len(event_type))
    return (f"{clock(doc.get('time'))}  #{doc.get('sequence', '')}  {shown}{pad}  "
            f"{visible(str(doc.get('subject', '')))}  {summary(doc)}").rstrip()


def use_colour(stream: Any, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in env
