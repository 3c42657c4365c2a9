"""Who did it: the actor every stored event carries (docs/events.md, "actor").

The actor is a property of the command being run, not of any one aggregate,
so it is set once where a command enters the control plane and stamped on
every event that command saves:

* a JSON-RPC call (``api/http/rpc.py``): the caller's API token id (``tok_…``), or
  ``local`` for the in-process CLI without a token;
* ``nodes.join``: the join token that admitted the machine (``jt_…``);
* a gateway session (``api/gateway/server.py``): the node (``node_…``), whose
  certificate and signatures the gateway verified;
* the controllers (``api/controllers/runner.py``): ``controller:nodes``,
  ``controller:reservations``, ``controller:tokens``;
* ``better-compute init``: ``local``.

The value lives in a context variable; anyio copies it into the worker
threads that run store calls. The store's mapper (``api/store/codec.py``) writes it
into each event's stored state as ``actor``, where the public log reads it. Events
made for several commands and saved together (the gateway's batches of its sessions'
changes, api/gateway/writes.py) carry each their own command's actor, stamped when made
(``stamp_actor``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

LOCAL = "local"  # the in-process CLI without a token, and `init`
CONTROLLER_NODES = "controller:nodes"
CONTROLLER_RESERVATIONS = "controller:reservations"
CONTROLLER_TOKENS = "controller:tokens"

_ACTOR: ContextVar[str | None] = ContextVar("better_compute_actor", default=None)

P = ParamSpec("P")
T = TypeVar("T")


def current_actor() -> str | None:
    return _ACTOR.get()


@contextmanager
def acting_as(actor: str | None) -> Iterator[None]:
    """Events saved inside the block carry ``actor``."""
    token = _ACTOR.set(actor)
    try:
        yield
    finally:
        _ACTOR.reset(token)


def as_actor(actor: str, function: Callable[P, T]) -> Callable[P, T]:
    """``function`` run with ``actor`` set (for functions handed to worker threads)."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        with acting_as(actor):
            return function(*args, **kwargs)

    return run


def stamp_actor(events: Iterable[Any]) -> None:
    """``events`` carry the current actor from now on, whoever saves them (the mapper keeps
    an actor an event already has)."""
    actor = _ACTOR.get()
    for event in events:
        event.__dict__["actor"] = actor
