"""events.list, projections.status and projections.rebuild."""

from __future__ import annotations

from typing import Any

import msgspec

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import NoParams, Params
from better_compute.api.store.eventlog import AuditFilter, EventLog, decode_lines, filter_for


class EventsList(Params, kw_only=True):
    since: int = 0
    types: str | list[str] | None = None
    limit: int = 100
    actor: str | None = None
    subject: str | None = None
    from_: str | None = msgspec.field(default=None, name="from")
    to: str | None = None


class ProjectionsRebuild(Params, kw_only=True):
    name: str | None = None


def events_list(call: Call, params: EventsList) -> dict[str, Any]:
    audit = AuditFilter.parse(params.actor, params.subject, params.from_, params.to,
                              call.service.clock())
    flt = filter_for(call.principal, params.types, audit=audit)
    page = EventLog(call.service.store).page(flt, params.since, params.limit)
    return {"events": decode_lines(page.entries), "head": page.head, "next": page.next}


def projections_status(call: Call, _: NoParams) -> list[dict[str, Any]]:
    call.principal.require_root_admin("read the projections' status")
    return [
        {"name": s.name, "position": s.position, "head": s.head, "lag": s.lag}
        for s in call.service.projections.status()
    ]


def projections_rebuild(call: Call, params: ProjectionsRebuild) -> list[dict[str, Any]]:
    call.principal.require_root_admin("rebuild projections")
    runner = call.service.projections
    names = [runner.get(params.name).name] if params.name else list(runner.projections)
    done = []
    for name in names:
        applied = runner.rebuild(name)
        status = next(s for s in runner.status() if s.name == name)
        done.append({"name": name, "applied": applied, "position": status.position,
                     "head": status.head, "lag": status.lag})
    return done
