"""Factories for reservation tests: pools and adopted nodes (shared with the benchmarks)."""

from typing import Any

from better_compute.benchmarks.fleet import add_nodes, build_node, gpu_docs, make_pool
from better_compute.domain.access import LOCAL_OPERATOR

__all__ = ["add_nodes", "build_node", "count_calls", "gpu_docs", "make_pool", "offered_pool",
           "placed_again"]


def offered_pool(service: Any, *, nodes: int, gpus: int, tenant: str = "acme") -> str:
    """A pool of ``nodes`` adopted nodes, offered to a new ``tenant`` with a quota of
    ``gpus``; its id."""
    pool = make_pool(service)
    add_nodes(service, pool, nodes)
    service.tenants_create(LOCAL_OPERATOR, tenant, None)
    service.pools_offer(LOCAL_OPERATOR, pool, tenant, {"gpu": gpus})
    return pool


def count_calls(monkeypatch: Any, cls: type, method: str) -> list[str]:
    """The ``public_id`` of each object ``cls.method`` runs on from now on, in order (the
    method still runs): how often a read model rendered or wrote an aggregate."""
    calls: list[str] = []
    real = getattr(cls, method)

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.public_id)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, method, counted)
    return calls


def placed_again(monkeypatch: Any) -> list[str]:
    """The node of each booking a create lost from now on (to another writer of the same
    bookings, quota use or node) and placed again, in order."""
    from better_compute.api.services.reservations import ReservationService

    lost: list[str] = []
    real = ReservationService._book_and_save

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        done = real(self, *args, **kwargs)
        if done is None:
            lost.append(kwargs["placement"].node_id)
        return done

    monkeypatch.setattr(ReservationService, "_book_and_save", counted)
    return lost
