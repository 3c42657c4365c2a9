"""Factories for reservation tests: pools and adopted nodes (shared with the benchmarks)."""

from typing import Any

from better_compute.benchmarks.fleet import add_nodes, build_node, gpu_docs, make_pool
from better_compute.domain.access import LOCAL_OPERATOR

__all__ = ["add_nodes", "build_node", "count_calls", "gpu_docs", "make_pool", "offered_pool"]


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
