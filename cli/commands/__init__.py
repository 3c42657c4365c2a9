"""One module per command group; GROUPS is the order `help` lists them in.

Registration is explicit, here: ``capacity`` gets reservations' ``--preview`` as an extension.
"""

from functools import partial
from types import SimpleNamespace

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

capacity_with_preview = SimpleNamespace(
    register=partial(capacity.register, extensions=[reservations.CAPACITY_PREVIEW]))

GROUPS = (setup, api, catalog, join_tokens, daemon, nodes, capacity_with_preview, reservations,
          events, projections, usage, store, completion)
