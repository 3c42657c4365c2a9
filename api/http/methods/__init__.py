"""JSON-RPC methods, one module per area; importing this registers them all."""

from better_compute.api.http.methods import (  # noqa: F401
    capacity,
    catalog,
    events,
    join,
    nodes,
    reservations,
    system,
    usage,
)
