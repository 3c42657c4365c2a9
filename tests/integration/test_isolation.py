"""Tenant isolation and roles, for EVERY JSON-RPC method, on both backends.

Each method registered in ``rpc.METHODS`` has a case here showing that a
tenant's token never reads or changes another tenant's objects (the answer is
not_found or permission_denied and the event log does not move) and that
roles are enforced. A method registered without a case fails
``test_every_method_has_an_isolation_case``: add a case, or (for a method of an
issue still being built) name it in KNOWN_UNCOVERED with a comment.

Calls go through ``rpc.handle`` with a bearer token's authentication, exactly
what ``POST /api/compute/rpc`` runs, minus the socket.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

import better_compute.api.methods  # noqa: F401  (registers every method)
from better_compute.api import rpc
from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR

# Methods whose isolation case is still to be written, each with the reason.
# Keep this short: a method listed here is NOT checked.
KNOWN_UNCOVERED: set[str] = {
    # join tokens and the join itself, built beside the foundation:
    "joinTokens.create", "joinTokens.get", "joinTokens.list", "joinTokens.revoke", "nodes.join",
    # the event log and the read models' maintenance:
    "events.list", "projections.rebuild", "projections.status",
    # nodes, capacity and reservations:
    "nodes.adopt", "nodes.cordon", "nodes.events", "nodes.get", "nodes.list", "nodes.uncordon",
    "capacity.get", "capacity.preview",
    "reservations.cancel", "reservations.create", "reservations.extend", "reservations.get",
    "reservations.list", "reservations.release",
}

POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}
DENIED = {"permission_denied", "not_found"}


@dataclass
class World:
    """Three tenants, three sites and pools, and tokens of every role.

    - pool_both on site_shared is offered to acme (gpu=16) and globex (gpu=8);
    - pool_acme on site_acme is offered to acme only (gpu=4);
    - pool_root on site_root is offered to nobody.
    """

    rt: Runtime
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    def call(self, who: str | None, method: str, **params: Any) -> tuple[Any, str | None]:
        """(result, None) or (None, error code), as the HTTP endpoint answers."""
        token = self.tokens[who] if who else None
        service = self.rt.service
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
        answer = json.loads(rpc.handle(body.encode(), service, lambda: service.authenticate(token)))
        if "error" in answer:
            return None, answer["error"]["data"]["code"]
        return answer["result"], None

    def ok(self, who: str | None, method: str, **params: Any) -> Any:
        result, code = self.call(who, method, **params)
        assert code is None, f"{who} {method} {params}: {code}"
        return result

    def head(self) -> int:
        return self.rt.store.recorder.max_notification_id() or 0

    def refused(self, who: str | None, method: str, codes: set[str] | str = DENIED,
                **params: Any) -> str:
        """The call fails with one of ``codes`` and the event log does not move."""
        expected = {codes} if isinstance(codes, str) else codes
        before = self.head()
        result, code = self.call(who, method, **params)
        assert code in expected, f"{who} {method} {params}: got {code} {result}"
        assert self.head() == before, f"{who} {method} changed the store although refused"
        return str(code)


def build_world(rt: Any) -> World:
    w = World(rt)
    service = rt.service
    w.tokens["root"] = rt.root_token
    for tenant in ("acme", "globex"):
        service.tenants_create(LOCAL_OPERATOR, tenant, None)
    for who, tenant, role in [
        ("root-member", "root", "member"), ("root-ro", "root", "read-only"),
        ("acme-admin", "acme", "admin"), ("acme-member", "acme", "member"),
        ("acme-ro", "acme", "read-only"), ("globex-admin", "globex", "admin"),
        ("globex-member", "globex", "member"),
    ]:
        doc = service.tokens_create(LOCAL_OPERATOR, tenant, role, who)
        w.tokens[who], w.token_ids[who] = doc["token"], doc["id"]
    w.token_ids["root"] = service.authenticate(rt.root_token).token_id
    for name in ("shared", "acme", "root"):
        w.ids[f"site_{name}"] = service.sites_create(
            LOCAL_OPERATOR, "shared", "eu-1", name, f"site-{name}")["id"]
        w.ids[f"pool_{name}"] = service.pools_create(
            LOCAL_OPERATOR, w.ids[f"site_{name}"], "metal-host", "H100", POLICY, name,
            f"pool-{name}")["id"]
    w.ids["pool_both"] = w.ids.pop("pool_shared")
    service.pools_offer(LOCAL_OPERATOR, w.ids["pool_both"], "acme", {"gpu": 16})
    service.pools_offer(LOCAL_OPERATOR, w.ids["pool_both"], "globex", {"gpu": 8})
    service.pools_offer(LOCAL_OPERATOR, w.ids["pool_acme"], "acme", {"gpu": 4})
    return w


Case = Callable[[World], None]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(fn: Case) -> Case:
        CASES[name] = fn
        return fn
    return register


# ------------------------------------------------------------------ system, rpc, pki


@case("system.whoami")
def _whoami(w: World) -> None:
    for who, tenant, role in [("acme-admin", "acme", "admin"), ("acme-ro", "acme", "read-only"),
                              ("globex-member", "globex", "member"), ("root", "root", "admin")]:
        me = w.ok(who, "system.whoami")
        assert (me["tenantId"], me["role"]) == (tenant, role)
        assert me["rootAdministrator"] is (who == "root")
        assert me["tokenId"] == w.token_ids[who]
    w.refused(None, "system.whoami", "unauthenticated")
    w.tokens["forged"] = "biam_" + "x" * 43
    w.refused("forged", "system.whoami", "unauthenticated")


@case("rpc.discover")
def _discover(w: World) -> None:
    anonymous = w.ok(None, "rpc.discover")
    assert [m["name"] for m in anonymous["methods"]] == sorted(rpc.METHODS)
    assert w.ok("acme-ro", "rpc.discover") == anonymous == w.ok("root", "rpc.discover")
    text = json.dumps(anonymous)
    for secret in ("acme", "globex", *w.ids.values()):
        assert secret not in text  # nothing about any tenant's objects


@case("pki.show")
def _pki_show(w: World) -> None:
    shown = w.ok("acme-ro", "pki.show")
    assert shown == w.ok("root", "pki.show")
    assert shown["servingCaSpkiPin"].startswith("sha256/")
    assert "PRIVATE KEY" not in json.dumps(shown)
    w.refused(None, "pki.show", "unauthenticated")


# ------------------------------------------------------------------------- tenants


@case("tenants.create")
def _tenants_create(w: World) -> None:
    for who in ("acme-admin", "acme-member", "root-member", "root-ro", "globex-admin"):
        w.refused(who, "tenants.create", "permission_denied", tenantId="initech")
    w.refused("acme-admin", "tenants.create", "permission_denied", tenantId="acme", name="Mine")
    w.refused("root", "tenants.get", "not_found", tenantId="initech")
    assert w.ok("root", "tenants.get", tenantId="acme")["name"] == "acme"
    assert w.ok("root", "tenants.create", tenantId="initech")["id"] == "initech"


@case("tenants.get")
def _tenants_get(w: World) -> None:
    for who, other in [("acme-admin", "globex"), ("acme-admin", "root"), ("globex-member", "acme"),
                       ("acme-ro", "globex")]:
        w.refused(who, "tenants.get", "not_found", tenantId=other)
    assert w.ok("acme-ro", "tenants.get", tenantId="acme")["id"] == "acme"
    assert w.ok("root-ro", "tenants.get", tenantId="globex")["id"] == "globex"


@case("tenants.list")
def _tenants_list(w: World) -> None:
    assert [t["id"] for t in w.ok("acme-member", "tenants.list")] == ["acme"]
    assert [t["id"] for t in w.ok("globex-admin", "tenants.list")] == ["globex"]
    assert {t["id"] for t in w.ok("root-ro", "tenants.list")} == {"root", "acme", "globex"}


# -------------------------------------------------------------------------- tokens


@case("tokens.create")
def _tokens_create(w: World) -> None:
    w.refused("acme-admin", "tokens.create", "permission_denied", tenantId="globex", role="admin")
    w.refused("acme-admin", "tokens.create", "permission_denied", tenantId="root", role="admin")
    for who in ("acme-member", "acme-ro"):
        w.refused(who, "tokens.create", "permission_denied", tenantId="acme", role="read-only")
        w.refused(who, "tokens.create", "permission_denied", role="read-only")
    for who in ("root-member", "root-ro"):
        w.refused(who, "tokens.create", "permission_denied", tenantId="acme", role="admin")
        w.refused(who, "tokens.create", "permission_denied", role="admin")
    minted = w.ok("acme-admin", "tokens.create", role="member")  # its own tenant by default
    assert minted["tenantId"] == "acme" and minted["token"].startswith("biam_")
    w.tokens["minted"] = minted["token"]
    assert w.ok("minted", "system.whoami")["tenantId"] == "acme"


@case("tokens.list")
def _tokens_list(w: World) -> None:
    w.refused("acme-admin", "tokens.list", "permission_denied", tenantId="globex")
    w.refused("acme-admin", "tokens.list", "permission_denied", tenantId="root")
    for who in ("acme-member", "acme-ro", "root-member", "root-ro"):
        w.refused(who, "tokens.list", "permission_denied")
    own = w.ok("acme-admin", "tokens.list")
    assert {t["id"] for t in own} == {w.token_ids[k] for k in ("acme-admin", "acme-member",
                                                                "acme-ro")}
    assert all("token" not in t and t["tenantId"] == "acme" for t in own)
    assert "biam_" not in json.dumps(own)
    globex = w.ok("root", "tokens.list", tenantId="globex")
    assert {t["tenantId"] for t in globex} == {"globex"}


@case("tokens.revoke")
def _tokens_revoke(w: World) -> None:
    for target in ("globex-admin", "root", "root-ro"):
        w.refused("acme-admin", "tokens.revoke", "not_found", tokenId=w.token_ids[target])
    w.refused("globex-admin", "tokens.revoke", "not_found", tokenId=w.token_ids["acme-ro"])
    w.refused("acme-member", "tokens.revoke", "permission_denied", tokenId=w.token_ids["acme-ro"])
    w.refused("root-member", "tokens.revoke", "permission_denied", tokenId=w.token_ids["acme-ro"])
    assert w.ok("globex-admin", "system.whoami")["tenantId"] == "globex"  # still works
    assert w.ok("root", "system.whoami")["tenantId"] == "root"
    revoked = w.ok("acme-admin", "tokens.revoke", tokenId=w.token_ids["acme-ro"])
    assert revoked["revokedAt"] is not None
    w.refused("acme-ro", "system.whoami", "unauthenticated")
    w.refused("acme-admin", "tokens.revoke", "conflict", tokenId=w.token_ids["acme-ro"])


# --------------------------------------------------------------------------- sites


@case("sites.create")
def _sites_create(w: World) -> None:
    for who in ("acme-admin", "globex-admin", "acme-member", "root-member", "root-ro"):
        for kind in ("shared", "dedicated"):
            w.refused(who, "sites.create", "permission_denied", kind=kind, region="eu-2")
    # A key root already used neither leaks root's site nor makes a second one.
    w.refused("acme-admin", "sites.create", "permission_denied", kind="shared", region="eu-1",
              name="shared", key="site-shared")
    assert len(w.ok("root", "sites.list")) == 3
    assert w.ok("root", "sites.create", kind="dedicated", region="eu-2")["kind"] == "dedicated"


@case("sites.get")
def _sites_get(w: World) -> None:
    for who, site in [("globex-admin", "site_acme"), ("globex-admin", "site_root"),
                      ("acme-admin", "site_root"), ("acme-ro", "site_root")]:
        w.refused(who, "sites.get", "not_found", siteId=w.ids[site])
    assert w.ok("globex-member", "sites.get", siteId=w.ids["site_shared"])["id"] == \
        w.ids["site_shared"]
    assert w.ok("acme-ro", "sites.get", siteId=w.ids["site_acme"])["id"] == w.ids["site_acme"]


@case("sites.list")
def _sites_list(w: World) -> None:
    assert {s["id"] for s in w.ok("acme-ro", "sites.list")} == {w.ids["site_shared"],
                                                                w.ids["site_acme"]}
    assert {s["id"] for s in w.ok("globex-admin", "sites.list")} == {w.ids["site_shared"]}
    assert len(w.ok("root-ro", "sites.list")) == 3


# --------------------------------------------------------------------------- pools


@case("pools.create")
def _pools_create(w: World) -> None:
    params = {"class": "metal-host", "gpuModel": "H100", "policy": POLICY}
    w.refused("acme-admin", "pools.create", "permission_denied", siteId=w.ids["site_shared"],
              **params)
    w.refused("acme-admin", "pools.create", "not_found", siteId=w.ids["site_root"], **params)
    w.refused("globex-admin", "pools.create", "not_found", siteId=w.ids["site_acme"], **params)
    for who in ("root-member", "root-ro", "acme-member"):
        w.refused(who, "pools.create", DENIED, siteId=w.ids["site_shared"], **params)
    # Root's key, reused by another tenant, returns nothing of root's.
    w.refused("acme-admin", "pools.create", "permission_denied", siteId=w.ids["site_shared"],
              key="pool-shared", **params)
    created = w.ok("root", "pools.create", siteId=w.ids["site_root"], **params)
    assert created["tenantId"] == "root"


@case("pools.get")
def _pools_get(w: World) -> None:
    for who, pool in [("globex-admin", "pool_acme"), ("globex-member", "pool_root"),
                      ("acme-admin", "pool_root"), ("acme-ro", "pool_root")]:
        w.refused(who, "pools.get", "not_found", poolId=w.ids[pool])
    seen = w.ok("acme-ro", "pools.get", poolId=w.ids["pool_both"])
    assert seen["offerings"] == [{"tenantId": "acme", "quota": {"gpu": 16}}]
    seen = w.ok("globex-member", "pools.get", poolId=w.ids["pool_both"])
    assert seen["offerings"] == [{"tenantId": "globex", "quota": {"gpu": 8}}]
    assert len(w.ok("root-ro", "pools.get", poolId=w.ids["pool_both"])["offerings"]) == 2


@case("pools.list")
def _pools_list(w: World) -> None:
    acme = w.ok("acme-member", "pools.list")
    assert {p["id"] for p in acme} == {w.ids["pool_both"], w.ids["pool_acme"]}
    assert all(o["tenantId"] == "acme" for p in acme for o in p["offerings"])
    globex = w.ok("globex-admin", "pools.list")
    assert [p["id"] for p in globex] == [w.ids["pool_both"]]
    assert globex[0]["offerings"] == [{"tenantId": "globex", "quota": {"gpu": 8}}]
    assert w.ok("globex-admin", "pools.list", siteId=w.ids["site_acme"]) == []
    assert w.ok("acme-ro", "pools.list", siteId=w.ids["site_root"]) == []
    assert len(w.ok("root-ro", "pools.list")) == 3


@case("pools.offer")
def _pools_offer(w: World) -> None:
    before = w.ok("root", "pools.get", poolId=w.ids["pool_both"])
    both = w.ids["pool_both"]
    for who in ("acme-admin", "acme-member", "acme-ro"):
        w.refused(who, "pools.offer", "permission_denied", poolId=both, toTenantId="acme",
                  quota={"gpu": 1000})
        w.refused(who, "pools.offer", "permission_denied", poolId=both, toTenantId="globex",
                  quota={"gpu": 0})
    w.refused("acme-admin", "pools.offer", "not_found", poolId=w.ids["pool_root"],
              toTenantId="acme", quota={"gpu": 8})
    w.refused("globex-admin", "pools.offer", "not_found", poolId=w.ids["pool_acme"],
              toTenantId="globex", quota={"gpu": 8})
    for who in ("root-member", "root-ro"):
        w.refused(who, "pools.offer", "permission_denied", poolId=both, toTenantId="acme",
                  quota={"gpu": 1})
    assert w.ok("root", "pools.get", poolId=both) == before
    changed = w.ok("root", "pools.offer", poolId=both, toTenantId="acme", quota={"gpu": 24})
    assert {"tenantId": "acme", "quota": {"gpu": 24}} in changed["offerings"]


# ---------------------------------------------------------------------------- tests


def test_every_method_has_an_isolation_case() -> None:
    registered = set(rpc.METHODS)
    missing = registered - set(CASES) - KNOWN_UNCOVERED
    assert not missing, (
        f"JSON-RPC methods without a tenant-isolation case: {sorted(missing)}. Add a @case to "
        "tests/integration/test_isolation.py showing another tenant's token is refused "
        "(not_found/permission_denied) and changes nothing"
    )
    stale = (KNOWN_UNCOVERED & set(CASES)) | (KNOWN_UNCOVERED - registered)
    assert not stale, f"remove {sorted(stale)} from KNOWN_UNCOVERED: covered or not registered"
    assert set(CASES) <= registered, f"cases for unknown methods: {set(CASES) - registered}"


@pytest.mark.parametrize("method", sorted(CASES))
def test_isolation(method: str, runtime: Any) -> None:
    world = build_world(runtime)
    CASES[method](world)


ROLE_MATRIX = [
    # (method, params) that every token below admin, of any tenant, must be refused
    ("tokens.create", lambda w: {"role": "read-only"}),
    ("sites.create", lambda w: {"kind": "shared", "region": "eu-9", "key": "role-site"}),
    ("pools.create", lambda w: {"siteId": w.ids["site_shared"], "class": "metal-host",
                                "gpuModel": "H100", "policy": POLICY}),
    ("pools.offer", lambda w: {"poolId": w.ids["pool_both"], "toTenantId": "globex",
                               "quota": {"gpu": 1}}),
    ("tenants.create", lambda w: {"tenantId": "initech"}),
]


def test_members_and_read_only_change_nothing(runtime: Any) -> None:
    """member and read-only tokens, of root or of a customer, create nothing at all."""
    w = build_world(runtime)
    for who in ("root-member", "root-ro", "acme-member", "acme-ro"):
        for method, params in ROLE_MATRIX:
            w.refused(who, method, "permission_denied", **params(w))


def test_only_root_admins_create_tenants_and_sites(runtime: Any) -> None:
    w = build_world(runtime)
    for who in ("acme-admin", "globex-admin"):
        w.refused(who, "tenants.create", "permission_denied", tenantId="initech")
        w.refused(who, "sites.create", "permission_denied", kind="dedicated", region="eu-9")
    assert w.ok("root", "tenants.create", tenantId="initech")["id"] == "initech"
    assert w.ok("root", "sites.create", kind="dedicated", region="eu-9")["tenantId"] == "root"
