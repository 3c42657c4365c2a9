"""Who did it: the actor every stored event carries (docs/events.md, "actor").

The actor is a property of the command being run, not of any one aggregate. The
command's entry point knows it and passes it to the save of what the command changed
(``ComputeStore.save(..., actor=...)``, and the services' ``actor=`` parameters down to it):

* a JSON-RPC call (``api/http/rpc.py``): the caller's API token id (``tok_…``), or
  ``local`` for the in-process CLI without a token: ``Principal.actor``;
* ``nodes.join``: the join token that admitted the machine (``jt_…``);
* a gateway session (``api/gateway/server.py``, ``session.py``): the node (``node_…``),
  whose certificate and signatures the gateway verified;
* the controllers (``api/controllers/``): ``controller:nodes``,
  ``controller:reservations``, ``controller:tokens``;
* ``better-compute init``: ``local``.

``stamp`` writes the actor on each event; the store's mapper (``api/store/codec.py``) stores
it as the event's ``actor``, where the public log reads it, and refuses an event that has
none (``MissingActor``). Events made for several commands and saved together (the gateway's
batches of its sessions' changes, ``NodeService.change_each``) are stamped each with their
own command's actor before the save.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from better_compute.domain.access import LOCAL

__all__ = ["CONTROLLER_NODES", "CONTROLLER_RESERVATIONS", "CONTROLLER_TOKENS", "LOCAL",
           "MissingActor", "stamp"]

CONTROLLER_NODES = "controller:nodes"
CONTROLLER_RESERVATIONS = "controller:reservations"
CONTROLLER_TOKENS = "controller:tokens"


class MissingActor(ValueError):
    """An event reached the store without an actor: a bug of the command that saved it."""


def stamp(events: Iterable[Any], actor: str | None) -> None:
    """``events`` carry ``actor`` (None: each keeps the actor it was stamped with)."""
    if actor is None:
        return
    for event in events:
        event.__dict__["actor"] = actor
