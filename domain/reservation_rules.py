"""What a reservation may ask for, and what a node's binding must match (docs/reservations.md).

Pure rules, checked by the reservation service before it places, extends or accepts a
binding; each refusal says what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from better_compute.domain.errors import Conflict, InvalidInput

MAX_GPUS = 1024
MIN_DURATION = timedelta(minutes=1)
MAX_DURATION = timedelta(days=366)
MAX_START_AHEAD = timedelta(days=366)


def check_gpu_count(gpus: Any) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise InvalidInput(f"--gpus {gpus!r} is not a GPU count: use a whole number from 1 "
                           f"to {MAX_GPUS} (for example --gpus 4)")
    return gpus


def check_length(length: timedelta, duration: str) -> None:
    """A reservation's length (``--for``): 1m to 366d."""
    if not MIN_DURATION <= length <= MAX_DURATION:
        raise InvalidInput(f"--for {duration} is out of range: reserve for 1m to 366d")


def check_extension(start: datetime, new_end: datetime) -> None:
    """An extended reservation still lasts at most ``MAX_DURATION`` from its start."""
    if new_end - start > MAX_DURATION:
        raise InvalidInput("a reservation lasts at most 366d: reserve again instead")


def cdi_devices(gpus: Iterable[str]) -> list[str]:
    """The CDI device names of the booked GPU UUIDs, as bcd binds them."""
    return [f"bcd.dev/gpu={u}" for u in gpus]


def check_bound_devices(node_id: str, allocation_id: str, reservation_id: str,
                        booked: Sequence[str], bound: Iterable[Any]) -> None:
    """A node's ``allocation.bound`` names exactly the CDI devices of the booked GPUs."""
    expected = sorted(cdi_devices(booked))
    devices = sorted(str(d) for d in bound)
    if devices != expected:
        raise Conflict(
            f"node {node_id} bound {allocation_id} with devices {devices}, but "
            f"{reservation_id} booked {expected}"
        )
