"""One module per command group; GROUPS is the order `help` lists them in."""

from better_compute.cli.commands import (
    api,
    capacity,
    catalog,
    completion,
    daemon,
    events,
    join_tokens,
    nodes,
    projections,
    reservations,
    setup,
    store,
    usage,
)

GROUPS = (setup, api, catalog, join_tokens, daemon, nodes, capacity, reservations, events,
          projections, usage, store, completion)
