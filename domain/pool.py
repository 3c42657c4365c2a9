"""Pools: machines of one GPU model with one policy, offered to tenants with quotas."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from eventsourcing.domain import event

from better_compute.domain.base import TenantOwned, fingerprint, iso
from better_compute.domain.errors import InvalidInput
from better_compute.domain.gpu_models import stored_model
from better_compute.domain.ids import keyed_uuid, new_uuid

NODE_CLASSES = ("metal-host",)


def check_node_class(node_class: str) -> None:
    if node_class not in NODE_CLASSES:
        raise InvalidInput(
            f"--class {node_class!r} is not a pool class: use {', '.join(NODE_CLASSES)}"
        )
QUOTA_RESOURCES = ("gpu",)
MAX_QUOTA_GPUS = 1_000_000  # far above any pool; bounds what a quota row can claim
UNLIMITED = None  # the owner's quota: effectively unlimited


def parse_quota(items: dict[str, Any]) -> dict[str, int]:
    """Check a quota map: only ``gpu`` grants anything, so any other name is refused."""
    if not items:
        raise InvalidInput("an offer needs a quota: pass --quota gpu=N (for example gpu=16)")
    quota: dict[str, int] = {}
    for name, value in items.items():
        if name not in QUOTA_RESOURCES:
            raise InvalidInput(
                f"quota resource {name!r} is not known: the resource is gpu (singular), "
                "as in --quota gpu=16; a quota row for any other name would grant nothing"
            )
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA_GPUS:
            shown = value if not isinstance(value, int) or value < 10**9 else f"{str(value)[:9]}..."
            raise InvalidInput(
                f"quota {name}={shown!r} is not a whole number of GPUs from 0 to {MAX_QUOTA_GPUS:,} "
                "(for example gpu=16)"
            )
        quota[name] = value
    return quota


class Pool(TenantOwned):
    PREFIX = "pool"
    TOPIC = "bc.aggregate.pool"
    # Every event gives an attribute a new value, never changes one in place: the aggregate
    # cache hands out shallow copies (api/store/aggregate_cache.py, COPY_ON_WRITE).
    COPY_ON_WRITE = True

    class Event(TenantOwned.Event):
        TOPIC = "bc.pool.event"

    @event("Created", topic="pool.created")
    def __init__(
        self, tenant_id: str, site_id: str, node_class: str, gpu_model: str,
        policy: dict[str, Any], name: str, key: str | None, fingerprint: str | None,
    ) -> None:
        self.tenant_id = tenant_id
        self.site_id = site_id
        self.node_class = node_class
        self.gpu_model = gpu_model
        self.policy = policy
        self.name = name
        self.key = key
        self.fingerprint = fingerprint
        self.offerings: dict[str, dict[str, int]] = {}

    @staticmethod
    def create_id(tenant_id: str, key: str | None, **_: Any) -> UUID:
        return keyed_uuid(tenant_id, "pool", key) if key else new_uuid()

    @classmethod
    def with_id(cls, id: UUID, **fields: Any) -> Pool:
        """A new pool with the given aggregate id (the service's, in the installation's
        namespace, domain/ids.py) instead of ``create_id``'s."""
        return cls._create(cls.Created, id=id, **fields)

    def offer(self, to_tenant: str, quota: dict[str, int]) -> bool:
        """Offer the pool to a tenant (or change its quota). False when nothing changes."""
        if to_tenant == self.tenant_id:
            raise InvalidInput(
                f"tenant {to_tenant} owns pool {self.public_id} and already has an effectively "
                "unlimited gpu quota on it: offer it to another tenant"
            )
        if self.offerings.get(to_tenant) == quota:
            return False
        self._offered(to_tenant=to_tenant, quota=quota)
        return True

    @event("Offered", topic="pool.offered")
    def _offered(self, to_tenant: str, quota: dict[str, int]) -> None:
        self.offerings = {**self.offerings, to_tenant: dict(quota)}

    def quota_for(self, tenant_id: str) -> int | None:
        """GPUs ``tenant_id`` may hold at once: None is unlimited (the owner), 0 is none."""
        if tenant_id == self.tenant_id:
            return UNLIMITED
        return self.offerings.get(tenant_id, {}).get("gpu", 0)

    def visible_to(self, tenant_id: str) -> bool:
        return tenant_id == self.tenant_id or tenant_id in self.offerings

    def offering_docs(self) -> list[dict[str, Any]]:
        return [
            {"tenantId": t, "quota": dict(q)} for t, q in sorted(self.offerings.items())
        ]

    def to_doc(self, viewer: str | None = None) -> dict[str, Any]:
        offerings = self.offering_docs()
        if viewer is not None and viewer != self.tenant_id:
            offerings = [o for o in offerings if o["tenantId"] == viewer]
        return {
            "id": self.public_id,
            "tenantId": self.tenant_id,
            "siteId": self.site_id,
            "class": self.node_class,
            "gpuModel": stored_model(self.gpu_model),  # a listing row's older snapshot too
            "policy": self.policy,
            "name": self.name,
            "key": self.key,
            "ownerQuota": {"gpu": "unlimited"},
            "offerings": offerings,
            "createdAt": iso(self.created_on),
        }


def create_params(site_id: str, node_class: str, gpu_model: str, policy: dict[str, Any],
                  name: str) -> dict[str, Any]:
    """What a pool's idempotency key compares (its ``fingerprint``)."""
    return {"site": site_id, "class": node_class, "gpuModel": gpu_model, "policy": policy,
            "name": name}


def _upcast_created_v1_v2(state: dict[str, Any]) -> None:
    """``pool.created`` v1 stored the model as earlier versions spelled it (``RTX6000``); v2
    holds today's name (domain/gpu_models.py ``LEGACY``, docs/gpu-models.md), and the
    fingerprint of the same parameters spelled so, so that retrying the create with the same
    key still returns the pool."""
    old = state.get("gpu_model")
    new = stored_model(old)
    if not old or not new or new == old:
        return
    state["gpu_model"] = new

    def fp(model: str) -> str:
        return fingerprint(create_params(state.get("site_id", ""), state.get("node_class", ""),
                                         model, state.get("policy") or {}, state.get("name", "")))

    if state.get("fingerprint") == fp(old):
        state["fingerprint"] = fp(new)


# The event class the @event decorator made: its version and upcast, read by the store's codec.
Pool.Created.class_version = 2  # type: ignore[attr-defined]
Pool.Created.upcast_v1_v2 = staticmethod(_upcast_created_v1_v2)  # type: ignore[attr-defined]
