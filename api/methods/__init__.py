"""JSON-RPC methods, one module per area; importing this registers them all."""

from better_compute.api.methods import catalog, system  # noqa: F401
