"""The domain: aggregates, rules and errors. No I/O happens here.

Importing the package is cheap: the CLI needs only ``domain.errors``, and a command line
must not pay for eventsourcing and every aggregate. The aggregates load on first use
(``from better_compute.domain import Node``) or with ``domain.aggregates``, which registers
every aggregate and event topic so stored events can be decoded (the store imports it).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AGGREGATES", "ApiToken", "GpuClaim", "JoinToken", "Node", "NodeBookings", "PkiBundle", "Pool",
    "QuotaUse", "Reservation", "Site", "Tenant",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from better_compute.domain import aggregates

        return getattr(aggregates, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
