"""How many PostgreSQL connections ``serve`` may open, against what the server allows.

Each process serving the API (one, or each of ``--workers N``) has its own connection pool
(``POOL_SIZE`` connections, up to ``POOL_MAX`` under load; the /watch follower's LISTEN
is one of them) and, while the store is away, one probe connection of its guard
(api/store/outage.py); the server's controllers hold one more (their leader lock, in
worker 0). So a server may open ``connections_needed(workers)``: 16 per worker and 1. PostgreSQL
refuses a connection beyond ``max_connections`` (100 by default; minus the slots kept for
superusers) with "too many clients", which would come at the worst time: under load, the
pool growing.

So ``serve`` on PostgreSQL asks the server first (``check_workers``):

* more workers than ``max_connections`` can ever hold, given with ``--workers``: refused
  at start (``invalid_input``, exit status 2), naming both fixes (fewer ``--workers``, or
  a larger ``max_connections``);
* the same from the default (a worker per core, on a machine with many cores): fewer
  workers, as many as fit, with one warning line saying so and how to get more;
* the connections other clients hold now leave too few: a warning line (not a refusal:
  other clients come and go, and a rolling restart has the old server's connections open
  while the new one starts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from better_compute.api.store.store import POOL_MAX, StoreConfig, redact
from better_compute.api.store.store_url import connect_kwargs
from better_compute.domain.errors import InvalidInput, Unavailable

log = logging.getLogger("better_compute.serve")

PER_WORKER = POOL_MAX + 1  # the pool at its largest, and the guard's probe
SERVER_EXTRA = 1  # the controllers' leader connection (worker 0)


def connections_needed(workers: int) -> int:
    return workers * PER_WORKER + SERVER_EXTRA


@dataclass(frozen=True)
class Capacity:
    max_connections: int
    reserved: int  # slots for superusers (and pg_use_reserved_connections, PostgreSQL 16+)
    others: int  # client connections open now, not this check's own

    @property
    def usable(self) -> int:
        return self.max_connections - self.reserved

    def workers_that_fit(self) -> int:
        return max(0, (self.usable - SERVER_EXTRA) // PER_WORKER)


def read_capacity(config: StoreConfig) -> Capacity:
    """``max_connections``, its reserved slots and the client connections open now."""
    import psycopg

    assert config.pg is not None
    try:
        with psycopg.connect(**{"connect_timeout": 10, **connect_kwargs(config.pg)},
                             autocommit=True) as conn:
            row: Any = conn.execute(
                "SELECT current_setting('max_connections')::int, "
                "current_setting('superuser_reserved_connections')::int "
                "+ coalesce(current_setting('reserved_connections', true), '0')::int, "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid())").fetchone()
    except psycopg.Error as exc:
        raise Unavailable(f"cannot reach PostgreSQL ({config.describe()}): "
                          f"{redact(str(exc), config.password)}") from None
    values = list(row.values()) if isinstance(row, dict) else list(row)
    return Capacity(int(values[0]), int(values[1]), int(values[2]))


def check_workers(config: StoreConfig, workers: int, *, from_default: bool) -> int:
    """The workers to start on this PostgreSQL: ``workers``, or fewer when they came from
    the default and cannot all fit; refuses ``--workers`` that cannot (module docstring)."""
    capacity = read_capacity(config)
    fit = capacity.workers_that_fit()
    where = (f"PostgreSQL's max_connections is {capacity.max_connections} "
             f"({capacity.reserved} kept for superusers)")
    if workers > fit and (not from_default or fit < 1):
        given = f"{workers} workers (one per core)" if from_default else f"--workers {workers}"
        fix = (f"use --workers {fit}, or raise max_connections to at least "
               f"{connections_needed(workers) + capacity.reserved}") if fit >= 1 else (
            "not even one worker fits: raise max_connections to at least "
            f"{connections_needed(1) + capacity.reserved}")
        raise InvalidInput(
            f"{given} may open {connections_needed(workers)} PostgreSQL connections "
            f"({PER_WORKER} per worker and {SERVER_EXTRA} for the controllers), but {where}: "
            f"{fix} (postgresql.conf, then restart PostgreSQL)")
    if workers > fit:
        log.warning("serving with %d worker processes instead of the core count, %d: each "
                    "may open %d PostgreSQL connections and %s; raise max_connections to at "
                    "least %d for a worker per core, or set --workers", fit, workers,
                    PER_WORKER, where, connections_needed(workers) + capacity.reserved)
        workers = fit
    if connections_needed(workers) > capacity.usable - capacity.others:
        log.warning("PostgreSQL has %d client connections open besides this server, which "
                    "may open %d: under load it may refuse some (\"too many clients\", %s); "
                    "use fewer --workers or raise max_connections",
                    capacity.others, connections_needed(workers), where)
    return workers
