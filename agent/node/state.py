"""bcd's own state file, BCD_ROOT/var/lib/bcd/state.json: where a restarted agent resumes.

It holds the last desired state the gateway sent, the applied and observed generations,
each section's state and the GPUs held by allocations. It is rewritten atomically after
every change, after the journal line that caused it (the journal is the record of what
was done; the state file is the summary bcd starts from).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from better_compute.api.wire.gateway import SectionState

from ..errors import BcdError, io_code
from ..files import write_atomic
from ..paths import Paths


class NodeState(msgspec.Struct, rename="camel", kw_only=True):
    node_id: str
    applied_generation: int = 0
    observed_generation: int = 0
    desired_sections: dict[str, Any] = msgspec.field(default_factory=dict)
    sections: dict[str, SectionState] = msgspec.field(default_factory=dict)
    holds: dict[str, str] = msgspec.field(default_factory=dict)  # GPU uuid -> allocation id
    last_epoch: int = 0
    toolkit_fingerprint: str | None = None  # what etc/cdi/nvidia.json was generated for


def state_dir(paths: Paths) -> Path:
    """``/var/lib/bcd``: the journal and the state file."""
    return paths.under("var/lib/bcd")


def load_state(path: Path, node_id: str) -> NodeState:
    """The saved state of ``node_id``; a fresh one when there is none.

    A state (and its journal) left by another node id, from before this machine joined
    afresh, is moved aside with that id as suffix rather than mixed into this node's.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return NodeState(node_id=node_id)
    except OSError as exc:
        raise BcdError(f"cannot read {path}: {exc.strerror}; run bcd node as root",
                       code=io_code(exc)) from None
    try:
        state = msgspec.json.decode(data, type=NodeState)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BcdError(f"{path} is damaged ({exc}): move it away and bcd starts afresh "
                       "(the gateway sends the desired state again)") from None
    if state.node_id != node_id:
        for old in (path, path.with_name("journal.jsonl")):
            if old.exists():
                old.rename(old.with_name(f"{old.name}.{state.node_id}"))
        return NodeState(node_id=node_id)
    return state


def save_state(path: Path, state: NodeState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    write_atomic(path, msgspec.json.encode(state), mode=0o640)


def removed_marker(paths: Paths) -> Path:
    """``/var/lib/bcd/removed``: the node id the control plane removed, then its message.

    bcd node writes it when the gateway says the node was removed; bcd join then joins
    again (the control plane gives the machine its node back) instead of saying
    "already joined", and deletes it once joined.
    """
    return state_dir(paths) / "removed"


def mark_removed(paths: Paths, node_id: str, message: str) -> None:
    marker = removed_marker(paths)
    marker.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    write_atomic(marker, f"{node_id}\n{message}\n".encode(), mode=0o640)


def removed_node(paths: Paths) -> str | None:
    """The node id the control plane removed, when bcd node was told so."""
    try:
        return removed_marker(paths).read_text().split("\n", 1)[0].strip() or None
    except OSError:
        return None


__all__ = ["NodeState", "SectionState", "load_state", "save_state", "state_dir"]
