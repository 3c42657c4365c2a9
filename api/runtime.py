"""The composition root: store, projections and every service, built from the environment.

``Runtime.open`` opens the store and the projections and builds every service once, over one
``Aggregates`` (api/services/registry.py, api/services/unit.py), with everything they need
passed in (the master key's reader, the token lifetimes, the published gateway URL): nothing
is attached later. ``serve`` and the CLI's in-process mode build the same Runtime, so both
read and write the same store. Registration is explicit too: the gateway's journal handlers
(api/gateway/journal.py ``journal_handlers``) are built from these services.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eventsourcing.domain import Snapshot
from eventsourcing.persistence import Notification, StoredEvent

from better_compute.api.http.server_config import with_file
from better_compute.api.services.compute import ComputeService
from better_compute.api.services.limits import ServiceLimits
from better_compute.api.services.registry import Services, build_services
from better_compute.api.services.tokens import lifetimes_from_env
from better_compute.api.services.unit import Aggregates
from better_compute.api.store.codec import event_class
from better_compute.api.store.store import (
    ComputeStore,
    SqlRunner,
    StoreConfig,
    open_store,
    setup_lock,
)
from better_compute.api.store.token_use import TokenUse
from better_compute.domain.errors import InvalidInput
from better_compute.domain.placement import NodePartition
from better_compute.projections.capacity import Capacity
from better_compute.projections.framework import ReadModels
from better_compute.projections.free_gpus import FreeGpus
from better_compute.projections.listings import Listings
from better_compute.projections.reservations import Reservations
from better_compute.projections.usage import UsageProjection

# Read models every save applies in its own transaction: the free-GPU index the placer reads
# (DESIGN.md), so a create reads it current without following the log first.
INLINE = ("free_gpus",)


class StoreEvents:
    """The notification log of a store, as projections read it."""

    def __init__(self, store: ComputeStore) -> None:
        self.store = store

    def select(self, after: int, limit: int) -> Sequence[Notification]:
        return self.store.recorder.select_notifications(
            start=after, limit=limit, inclusive_of_start=False
        )

    def decode(self, notification: Notification) -> Any:
        return self.store.mapper.to_domain_event(notification)

    def event_type(self, notification: Notification) -> type[Any]:
        return event_class(notification.topic)

    def head(self) -> int:
        return self.store.recorder.max_notification_id() or 0

    def snapshot(self, aggregate: Any) -> tuple[str, str]:
        stored = self.store.mapper.to_stored_event(Snapshot.take(aggregate))
        return stored.topic, stored.state.decode()

    def restore(self, topic: str, state: str, originator_id: Any, version: int) -> Any:
        stored = StoredEvent(originator_id=originator_id, originator_version=version, topic=topic,
                             state=state.encode())
        event: Any = self.store.mapper.to_domain_event(stored)
        return event.mutate(None)


class Projections(ReadModels):
    def __init__(self, store: ComputeStore) -> None:
        source = StoreEvents(store)
        self.sql: SqlRunner = store.sql()
        super().__init__(self.sql, source, [Listings(source), Capacity(),
                                            FreeGpus(source), Reservations(source),
                                            UsageProjection()], inline=INLINE)
        store.inline = self  # applied by every save, in its own transaction


@dataclass
class Runtime:
    config: StoreConfig
    store: ComputeStore
    projections: Projections
    services: Services
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def open(cls, env: Mapping[str, str] | None = None, *, gateway_url: str | None = None,
             partition: NodePartition | None = None) -> Runtime:
        """``gateway_url``: the agents' gateway as ``serve`` publishes it (nodes.join answers
        it); None in the CLI's in-process mode. ``partition``: a worker of ``serve --workers``
        places on its own share of the nodes first (domain/placement.py)."""
        env = with_file(os.environ if env is None else env)  # BETTER_COMPUTE_CONFIG's file
        config = StoreConfig.from_env(env)
        with setup_lock(config):  # the store's and the projections' tables
            store = open_store(config)
            try:
                projections = Projections(store)
                TokenUse.create_table(projections.sql)
                lifetimes = lifetimes_from_env(env)
                limits = ServiceLimits.from_env(env)
            except BaseException:
                store.close()
                raise
        services = build_services(Aggregates(store, projections), lifetimes=lifetimes,
                                  master_key_text=lambda: master_key_text(env, config),
                                  gateway_url=gateway_url, partition=partition, limits=limits)
        return cls(config, store, projections, services, env)

    @property
    def service(self) -> ComputeService:
        return self.services.compute

    def close(self) -> None:
        try:
            self.service.token_use.flush()  # the last uses noted (the CLI's in-process mode)
        except Exception:  # the store is gone: a last-use time is not worth failing for
            pass
        finally:
            self.store.close()

    @property
    def data_dir(self) -> Path:
        return self.config.data_dir

    def master_key_path(self) -> Path:
        return master_key_path(self.env, self.config)

    def master_key_text(self) -> str:
        return master_key_text(self.env, self.config)


def master_key_path(env: Mapping[str, str], config: StoreConfig) -> Path:
    return Path(env.get("BETTER_COMPUTE_MASTER_KEY_FILE") or config.data_dir / "master.key")


def master_key_text(env: Mapping[str, str], config: StoreConfig) -> str:
    if env.get("BETTER_COMPUTE_MASTER_KEY"):
        return env["BETTER_COMPUTE_MASTER_KEY"]
    path = master_key_path(env, config)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise InvalidInput(
            f"no master key at {path}: set BETTER_COMPUTE_MASTER_KEY_FILE to the file "
            "`better-compute init` wrote, or BETTER_COMPUTE_MASTER_KEY to its contents"
        ) from None
