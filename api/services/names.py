"""Names wherever an id is taken: a site, pool or node by its id or by its name.

Every method param ``siteId``, ``poolId`` and ``nodeId`` takes either the object's id
(``pool_…``) or its name, resolved here to the id before the method runs, so the rule is the
same for every method, the CLI and the console (docs/api.md, "Names"; docs/decisions.md):

- a ref that is a well-formed id of its kind is that id (looked up as before);
- anything else is a name: a site's or a pool's ``name``, or its idempotency ``key`` when it
  was created without a name (what the console titles its cards with); a node's hostname,
  as bcd reported it when the machine joined;
- a name is looked up among the objects the caller sees (its tenant's, and the pools offered
  to it with their sites; root sees every tenant's). None: ``not_found``. More than one:
  ``ambiguous`` (an input error, exit 2), which lists the matches with their ids, to use
  instead.

A name is found through the listings read model, whose documents are searched for the name's
JSON text (an index-free scan of one kind's rows, without decoding the others), then checked
field by field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from better_compute.api.services.unit import Aggregates
from better_compute.domain.access import Principal
from better_compute.domain.errors import Ambiguous, InvalidInput, NotFound
from better_compute.domain.ids import PREFIXES, parse_id

P = TypeVar("P", bound=msgspec.Struct)

MAX_MATCHES_SHOWN = 10

# The params that name an object, by the Struct field: the kind of object and its id prefix.
REFS = {"site_id": "site", "pool_id": "pool", "node_id": "node"}
_LISTED = {"site": "site", "pool": "pool", "node": "node"}  # listing kind of each ref kind
_LIST_COMMAND = {"site": "sites list", "pool": "pools list", "node": "nodes list -o wide"}


def object_name(kind: str, doc: dict[str, Any]) -> str | None:
    """The name a person knows ``doc`` (a listing document of ``kind``) by."""
    if kind == "node":
        hardware = doc.get("hardware")
        return hardware.get("hostname") or None if isinstance(hardware, dict) else None
    return doc.get("name") or doc.get("key") or None


def is_id(kind: str, ref: str) -> bool:
    try:
        parse_id(kind, ref)
    except InvalidInput:
        return False
    return True


class Names:
    """Resolves names to ids for a caller, over the shared ``Aggregates``' listings."""

    def __init__(self, aggregates: Aggregates) -> None:
        self.aggregates = aggregates

    def resolve_params(self, principal: Principal | None, params: P) -> P:
        """``params`` with each site, pool and node ref given by name replaced by the id."""
        if principal is None:
            return params
        changes: dict[str, str] = {}
        for field, kind in REFS.items():
            ref = getattr(params, field, None)
            if isinstance(ref, str) and ref and not is_id(kind, ref):
                changes[field] = self.resolve(principal, kind, ref)
        return msgspec.structs.replace(params, **changes) if changes else params

    def resolve(self, principal: Principal, kind: str, ref: str) -> str:
        """The id of the one ``kind`` named ``ref`` that ``principal`` sees (or ``ref`` itself
        when it is an id)."""
        if is_id(kind, ref):
            return ref
        matches = [d for d in self._named(principal, kind, ref) if object_name(kind, d) == ref]
        if len(matches) == 1:
            return str(matches[0]["id"])
        if not matches:
            if ref.startswith(f"{kind}_") or any(is_id(other, ref) for other in PREFIXES):
                parse_id(kind, ref)  # a mistyped id, or another kind's: say what ids look like
            raise NotFound(f"no {kind} named {ref!r} among the {kind}s you see: "
                           f"`better-compute {_LIST_COMMAND[kind]}` shows their names and ids")
        shown = ", ".join(f"{d['id']} (tenant {d.get('tenantId')})"
                          for d in matches[:MAX_MATCHES_SHOWN])
        more = f" and {len(matches) - MAX_MATCHES_SHOWN} more" \
            if len(matches) > MAX_MATCHES_SHOWN else ""
        raise Ambiguous(
            f"{ref!r} names {len(matches)} {kind}s you see: {shown}{more}; use the id",
            data={"matches": [{"id": d["id"], "tenantId": d.get("tenantId"),
                               "name": object_name(kind, d)}
                              for d in matches[:MAX_MATCHES_SHOWN]]})

    def _named(self, principal: Principal, kind: str, name: str) -> list[dict[str, Any]]:
        """The documents of ``kind`` the caller sees whose text holds ``name`` as a string."""
        text = msgspec.json.encode(name).decode()
        listing: Callable[..., list[dict[str, Any]]] = self.aggregates.listing
        if principal.is_root:
            return listing(_LISTED[kind], containing=text)
        tenant = principal.tenant_id
        if kind == "pool":
            return listing("pool", visible_to=tenant, containing=text)
        own = listing(_LISTED[kind], tenant_id=tenant, containing=text)
        if kind != "site":
            return own
        hosting = {p["siteId"] for p in listing("pool", visible_to=tenant)}
        shared = [s for s in listing("site", containing=text)
                  if s["id"] in hosting and s["tenantId"] != tenant]
        return own + shared
