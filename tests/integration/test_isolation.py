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

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import x25519

from better_compute.api import pki
from better_compute.api.http import rpc
from better_compute.api.runtime import Runtime
from better_compute.api.wire.join import JoinRequest
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.ids import parse_id
from tests.fleet import add_nodes
from tests.join_client import JoinAttempt, hardware, open_response
from tests.support import POLICY, initialized_runtime
from tests.watching import Stream, serving_app

# Methods whose isolation case is still to be written, each with the reason.
# Keep this short: a method listed here is NOT checked.
KNOWN_UNCOVERED: set[str] = set()

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
        answer = json.loads(rpc.handle(body.encode(), self.rt.services,
                                       lambda: service.authenticate(token)))
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


@case("tokens.rotate")
def _tokens_rotate(w: World) -> None:
    for target in ("globex-admin", "root", "root-ro"):
        w.refused("acme-admin", "tokens.rotate", "not_found", tokenId=w.token_ids[target])
    w.refused("globex-admin", "tokens.rotate", "not_found", tokenId=w.token_ids["acme-ro"])
    for who in ("acme-member", "acme-ro", "root-member", "root-ro"):  # not their own token
        w.refused(who, "tokens.rotate", "permission_denied", tokenId=w.token_ids["acme-admin"])
    assert w.ok("acme-admin", "system.whoami")["tenantId"] == "acme"  # nothing rotated
    own = w.ok("acme-member", "tokens.rotate", tokenId=w.token_ids["acme-member"], grace="0s")
    assert (own["tenantId"], own["role"], own["rotatedFrom"]) == (
        "acme", "member", w.token_ids["acme-member"])
    w.refused("acme-member", "system.whoami", "unauthenticated")  # no grace asked
    rotated = w.ok("acme-admin", "tokens.rotate", tokenId=w.token_ids["acme-ro"])
    assert rotated["role"] == "read-only" and rotated["tenantId"] == "acme"  # no escalation
    assert w.ok("acme-ro", "system.whoami")["tenantId"] == "acme"  # in its grace period


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


# ------------------------------------------------------- fleet: nodes and reservations


def with_fleet(w: World) -> None:
    """Adopted nodes and reservations, made without processes (tests/fleet.py).

    - node_both, node_both_2 (root's, adopted) in pool_both; node_root in pool_root;
    - node_acme (adopted) and node_acme_new (adopting, never accepted) owned by acme in
      pool_acme. Today every pool, hence every node, belongs to the root tenant; these two
      stand for the nodes of a tenant-owned (dedicated) pool, so the node methods are checked
      against the tenant rule itself and not only against "root's objects";
    - rsv_acme (now, 2 GPUs for 2h) and rsv_acme_later (in 3h, 1 GPU) of acme, rsv_globex (now,
      1 GPU) of globex, all in pool_both; acme and globex used the SAME key "rsv-1".
    """
    service = w.rt.service
    w.ids["node_both"], w.ids["node_both_2"] = add_nodes(service, w.ids["pool_both"], 2)
    [w.ids["node_root"]] = add_nodes(service, w.ids["pool_root"], 1)
    [w.ids["node_acme"]] = add_nodes(service, w.ids["pool_acme"], 1, owner="acme")
    [w.ids["node_acme_new"]] = add_nodes(service, w.ids["pool_acme"], 1, owner="acme",
                                         adopted=False)
    both = w.ids["pool_both"]
    w.ids["rsv_acme"] = w.ok("acme-member", "reservations.create", poolId=both, gpus=2,
                             duration="2h", key="rsv-1")["id"]
    w.ids["rsv_acme_later"] = w.ok("acme-member", "reservations.create", poolId=both, gpus=1,
                                   duration="1h", start="+3h", key="rsv-2")["id"]
    w.ids["rsv_globex"] = w.ok("globex-member", "reservations.create", poolId=both, gpus=1,
                               duration="2h", key="rsv-1")["id"]


def unchanged(w: World, who: str, method: str, **params: Any) -> Any:
    """A read that succeeds and leaves the event log where it was."""
    before = w.head()
    result = w.ok(who, method, **params)
    assert w.head() == before, f"{who} {method} changed the store although it only reads"
    return result


# ------------------------------------------------------------- join tokens, nodes.join


def mint(w: World, pool: str = "pool_root", **params: Any) -> dict[str, Any]:
    return w.ok("root", "joinTokens.create", poolId=w.ids[pool], ttl="2h", **params)  # type: ignore[no-any-return]


@case("joinTokens.create")
def _join_tokens_create(w: World) -> None:
    root_pool, both, acme_pool = w.ids["pool_root"], w.ids["pool_both"], w.ids["pool_acme"]
    # A tenant a pool is offered to cannot let machines into it; nobody else sees it at all.
    for who in ("acme-admin", "acme-member", "acme-ro", "globex-admin"):
        w.refused(who, "joinTokens.create", "permission_denied", poolId=both, ttl="2h")
    w.refused("acme-admin", "joinTokens.create", "not_found", poolId=root_pool, ttl="2h")
    w.refused("globex-admin", "joinTokens.create", "not_found", poolId=acme_pool, ttl="2h")
    for who in ("root-member", "root-ro"):
        w.refused(who, "joinTokens.create", "permission_denied", poolId=root_pool, ttl="2h")
    # root's key, reused by acme on an offered pool, neither mints nor returns root's token.
    first = mint(w, "pool_both", key="jt-shared")
    w.refused("acme-admin", "joinTokens.create", "permission_denied", poolId=both, ttl="2h",
              key="jt-shared")
    assert first["token"].startswith("bcjt_") and first["tenantId"] == "root"
    w.refused("acme-admin", "joinTokens.get", "not_found", joinTokenId=first["id"])


@case("joinTokens.get")
def _join_tokens_get(w: World) -> None:
    minted = mint(w)
    for who in ("acme-admin", "acme-ro", "globex-admin", "globex-member"):
        w.refused(who, "joinTokens.get", "not_found", joinTokenId=minted["id"])
    seen = unchanged(w, "root-ro", "joinTokens.get", joinTokenId=minted["id"])
    assert seen["id"] == minted["id"] and "token" not in seen
    assert minted["token"] not in json.dumps(seen)


@case("joinTokens.list")
def _join_tokens_list(w: World) -> None:
    minted = mint(w, "pool_both")
    for who in ("acme-admin", "acme-ro", "globex-member"):
        assert w.ok(who, "joinTokens.list") == []
        assert w.ok(who, "joinTokens.list", poolId=w.ids["pool_both"]) == []
    w.refused("acme-admin", "joinTokens.list", "permission_denied", tenantId="root")
    w.refused("globex-admin", "joinTokens.list", "permission_denied", tenantId="acme")
    seen = unchanged(w, "root-ro", "joinTokens.list")
    assert [t["id"] for t in seen] == [minted["id"]]
    assert minted["token"] not in json.dumps(seen) and "token" not in seen[0]


@case("joinTokens.revoke")
def _join_tokens_revoke(w: World) -> None:
    minted = mint(w, "pool_both")
    for who in ("acme-admin", "globex-admin", "acme-member"):
        w.refused(who, "joinTokens.revoke", "not_found", joinTokenId=minted["id"])
    for who in ("root-member", "root-ro"):
        w.refused(who, "joinTokens.revoke", "permission_denied", joinTokenId=minted["id"])
    assert w.ok("root", "joinTokens.get", joinTokenId=minted["id"])["state"] == "active"
    assert w.ok("root", "joinTokens.revoke", joinTokenId=minted["id"])["state"] == "revoked"


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[Runtime]:
    """conftest's ``runtime``, keeping its master key: nodes.join unseals the PKI with it."""
    rt = initialized_runtime(env)
    yield rt
    rt.close()


def sealed_join(w: World, secret: str, serial: str, **extra: Any) -> tuple[str, JoinAttempt]:
    """A sealed JoinRequest as bcd sends it, plus any ``extra`` fields an attacker adds."""
    attempt = JoinAttempt(secret, hardware(serial=serial))
    request = JoinRequest(token=secret, nonce=attempt.nonce, csr_pem=attempt.csr_pem(),
                          hardware=attempt.facts, bcd_version="0.1.0")
    doc = {**msgspec.to_builtins(request), **extra}
    public = w.rt.service.pki().public
    recipient = serialization.load_pem_public_key(public["joinEncryptionPublicKey"].encode())
    assert isinstance(recipient, x25519.X25519PublicKey)
    sealed = pki.seal_to(recipient, json.dumps(doc).encode())
    return base64.b64encode(sealed).decode(), attempt


@case("nodes.join")
def _nodes_join(w: World) -> None:
    public = w.rt.service.pki().public
    minted = mint(w, "pool_root", maxUses=5)
    secret = minted["token"]
    # The request (and the params around it) may name acme's pool, tenant and site: the node
    # still lands in the token's pool, with the token's tenant, whoever's bearer comes along.
    elsewhere = {"poolId": w.ids["pool_acme"], "tenantId": "acme", "siteId": w.ids["site_acme"],
                 "pool_id": w.ids["pool_acme"], "tenant_id": "acme"}
    sealed, _ = sealed_join(w, secret, "SN-1", **elsewhere)
    answer = w.ok("acme-admin", "nodes.join", sealed=sealed, **elsewhere)
    joined = open_response(answer, public)
    assert (joined.pool_id, joined.tenant_id, joined.site_id) == (
        w.ids["pool_root"], "root", w.ids["site_root"])
    sealed, _ = sealed_join(w, secret, "SN-2")
    anonymous = open_response(w.ok(None, "nodes.join", sealed=sealed), public)
    assert (anonymous.pool_id, anonymous.tenant_id) == (w.ids["pool_root"], "root")
    node = w.ok("root", "nodes.get", nodeId=joined.node_id)
    assert (node["poolId"], node["tenantId"]) == (w.ids["pool_root"], "root")
    for who in ("acme-admin", "globex-admin"):
        w.refused(who, "nodes.get", "not_found", nodeId=joined.node_id)
        assert w.ok(who, "nodes.list") == []
    # Credentials that are not this join token create nothing anywhere.
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    for bad in (forged, w.tokens["acme-admin"], "bcjt_nothing.here"):
        sealed, _ = sealed_join(w, bad, "SN-3")
        w.refused("acme-admin", "nodes.join", "unauthenticated", sealed=sealed)
    w.ok("root", "joinTokens.revoke", joinTokenId=minted["id"])
    sealed, _ = sealed_join(w, secret, "SN-4")
    w.refused(None, "nodes.join", "permission_denied", sealed=sealed)
    assert len(w.ok("root", "nodes.list")) == 2


# ------------------------------------------------------------ events, projections


@case("events.list")
def _events_list(w: World) -> None:
    with_fleet(w)
    everything = w.ok("root-ro", "events.list", limit=1000)
    assert everything["next"] == everything["head"] == w.head()
    by_tenant: dict[str, set[int]] = {}
    for event in everything["events"]:
        by_tenant.setdefault(event["tenantId"], set()).add(event["sequence"])
    assert {"root", "acme", "globex"} <= set(by_tenant)
    for who, tenant, other in [("acme-ro", "acme", "globex"), ("acme-admin", "acme", "globex"),
                               ("globex-member", "globex", "acme")]:
        page = unchanged(w, who, "events.list", limit=1000)
        assert {e["sequence"] for e in page["events"]} == by_tenant[tenant]
        text = json.dumps(page["events"])
        assert other not in text and w.ids[f"rsv_{other}"] not in text
        hidden = ["pool_root", "node_root"] + (["node_acme", "node_acme_new"]
                                               if tenant == "globex" else [])
        assert not [h for h in hidden if w.ids[h] in text], hidden
        # Type globs narrow what a tenant sees; they never widen it.
        for types in ("*", "node.*,pool.*,bookings.*,site.*", ["reservation.*", "token.*"]):
            narrowed = w.ok(who, "events.list", types=types, limit=1000)["events"]
            assert {e["tenantId"] for e in narrowed} <= {tenant}
        # Page by page, from any position, only its own events come back.
        seen, since = [], 0
        while True:
            step = w.ok(who, "events.list", since=since, limit=3)
            seen += [e["sequence"] for e in step["events"]]
            if step["next"] >= step["head"]:
                break
            since = step["next"]
        assert set(seen) == by_tenant[tenant] and len(seen) == len(set(seen))
    assert [e["type"] for e in w.ok("globex-admin", "events.list", types="node.*")["events"]] == []
    w.refused(None, "events.list", "unauthenticated")


@case("projections.status")
def _projections_status(w: World) -> None:
    for who in ("acme-admin", "acme-ro", "globex-admin", "root-member", "root-ro"):
        w.refused(who, "projections.status", "permission_denied")
    w.refused(None, "projections.status", "unauthenticated")
    status = w.ok("root", "projections.status")
    assert {"listings", "capacity"} <= {s["name"] for s in status}


@case("projections.rebuild")
def _projections_rebuild(w: World) -> None:
    w.rt.projections.catch_up()
    before = w.ok("root", "projections.status")
    for who in ("acme-admin", "acme-member", "globex-admin", "root-member", "root-ro"):
        w.refused(who, "projections.rebuild", "permission_denied")
        w.refused(who, "projections.rebuild", "permission_denied", name="listings")
    # Refused rebuilds left the read models alone (nothing emptied them).
    assert w.ok("root", "projections.status") == before
    with w.rt.projections.sql.transaction(commit=False) as cursor:
        w.rt.projections.sql.execute(cursor, "SELECT COUNT(*) AS n FROM bc_listing")
        assert cursor.fetchone()["n"] > 0
    done = w.ok("root", "projections.rebuild", name="listings")
    assert [d["name"] for d in done] == ["listings"] and done[0]["lag"] == 0
    assert [t["id"] for t in w.ok("acme-ro", "tenants.list")] == ["acme"]


# --------------------------------------------------------------------------- nodes


@case("nodes.list")
def _nodes_list(w: World) -> None:
    with_fleet(w)
    acme_nodes = {w.ids["node_acme"], w.ids["node_acme_new"]}
    for who in ("acme-admin", "acme-ro"):
        assert {n["id"] for n in unchanged(w, who, "nodes.list")} == acme_nodes
        # Root's nodes in a pool offered to acme are root's, not acme's.
        assert w.ok(who, "nodes.list", poolId=w.ids["pool_both"]) == []
    for who in ("globex-admin", "globex-member"):
        assert w.ok(who, "nodes.list") == []
        assert w.ok(who, "nodes.list", poolId=w.ids["pool_acme"]) == []
    w.refused("globex-admin", "nodes.list", "permission_denied", tenantId="acme")
    w.refused("acme-ro", "nodes.list", "permission_denied", tenantId="root")
    assert len(w.ok("root-ro", "nodes.list")) == 5
    assert {n["id"] for n in w.ok("root-ro", "nodes.list", tenantId="acme")} == acme_nodes


@case("nodes.get")
def _nodes_get(w: World) -> None:
    with_fleet(w)
    for who, node in [("globex-admin", "node_acme"), ("globex-member", "node_acme_new"),
                      ("acme-admin", "node_both"), ("acme-ro", "node_root"),
                      ("globex-admin", "node_both")]:
        w.refused(who, "nodes.get", "not_found", nodeId=w.ids[node])
        w.refused(who, "nodes.get", "not_found", nodeId=w.ids[node], tenantId=who.split("-")[0])
    assert unchanged(w, "acme-ro", "nodes.get", nodeId=w.ids["node_acme"])["tenantId"] == "acme"
    assert w.ok("root-ro", "nodes.get", nodeId=w.ids["node_acme"])["id"] == w.ids["node_acme"]


@case("nodes.events")
def _nodes_events(w: World) -> None:
    with_fleet(w)
    for who, node in [("globex-admin", "node_acme"), ("acme-admin", "node_both"),
                      ("acme-ro", "node_root")]:
        w.refused(who, "nodes.events", "not_found", nodeId=w.ids[node])
    events = unchanged(w, "acme-ro", "nodes.events", nodeId=w.ids["node_acme"])
    assert events and {e["subject"] for e in events} == {w.ids["node_acme"]}
    assert {e["tenantId"] for e in events} == {"acme"}
    assert w.ok("root-ro", "nodes.events", nodeId=w.ids["node_acme"]) == events


def node_state(w: World, node: str) -> dict[str, Any]:
    return w.ok("root", "nodes.get", nodeId=w.ids[node])  # type: ignore[no-any-return]


@case("nodes.cordon")
def _nodes_cordon(w: World) -> None:
    with_fleet(w)
    for who, node, code in [
        ("globex-admin", "node_acme", "not_found"), ("acme-admin", "node_both", "not_found"),
        ("acme-admin", "node_root", "not_found"), ("acme-member", "node_acme", "permission_denied"),
        ("acme-ro", "node_acme", "permission_denied"),
        ("root-member", "node_acme", "permission_denied"),
        ("root-member", "node_root", "permission_denied"),
        ("root-ro", "node_both", "permission_denied"),
    ]:
        w.refused(who, "nodes.cordon", code, nodeId=w.ids[node], reason="mine now")
    for node in ("node_acme", "node_both", "node_root"):
        assert node_state(w, node)["maintenance"]["cordoned"] is False
    cordoned = w.ok("acme-admin", "nodes.cordon", nodeId=w.ids["node_acme"], reason="reseat")
    assert cordoned["maintenance"]["cordoned"] is True


@case("nodes.uncordon")
def _nodes_uncordon(w: World) -> None:
    with_fleet(w)
    for node in ("node_acme", "node_both"):
        w.ok("root", "nodes.cordon", nodeId=w.ids[node], reason="maintenance")
    for who, node, code in [
        ("globex-admin", "node_acme", "not_found"), ("acme-admin", "node_both", "not_found"),
        ("acme-member", "node_acme", "permission_denied"),
        ("acme-ro", "node_acme", "permission_denied"),
        ("root-member", "node_both", "permission_denied"),
        ("root-ro", "node_acme", "permission_denied"),
    ]:
        w.refused(who, "nodes.uncordon", code, nodeId=w.ids[node])
    for node in ("node_acme", "node_both"):
        assert node_state(w, node)["maintenance"]["cordoned"] is True
    done = w.ok("acme-admin", "nodes.uncordon", nodeId=w.ids["node_acme"])
    assert done["maintenance"]["cordoned"] is False


_NODE_CHANGE_REFUSALS = [
    ("globex-admin", "node_acme", "not_found"), ("acme-admin", "node_both", "not_found"),
    ("acme-admin", "node_root", "not_found"), ("acme-member", "node_acme", "permission_denied"),
    ("acme-ro", "node_acme", "permission_denied"),
    ("root-member", "node_acme", "permission_denied"),
    ("root-member", "node_root", "permission_denied"),
    ("root-ro", "node_both", "permission_denied"),
]


@case("nodes.drain")
def _nodes_drain(w: World) -> None:
    with_fleet(w)
    for who, node, code in _NODE_CHANGE_REFUSALS:
        w.refused(who, "nodes.drain", code, nodeId=w.ids[node], reason="mine now")
    for node in ("node_acme", "node_both", "node_root"):
        assert node_state(w, node)["maintenance"]["state"] == "none"
    drained = w.ok("acme-admin", "nodes.drain", nodeId=w.ids["node_acme"], reason="psu")
    assert drained["maintenance"]["state"] == "drained"  # nothing held on it


@case("nodes.remove")
def _nodes_remove(w: World) -> None:
    with_fleet(w)
    for who, node, code in _NODE_CHANGE_REFUSALS:
        w.refused(who, "nodes.remove", code, nodeId=w.ids[node], force=True)
    holding = rsv(w, "rsv_acme")["nodeId"]  # root's node, holding acme's reservation
    w.refused("acme-admin", "nodes.remove", "not_found", nodeId=holding, force=True)
    w.refused("root", "nodes.remove", "conflict", nodeId=holding)  # held: needs --force
    for node in ("node_acme", "node_both", "node_root"):
        assert node_state(w, node)["provisionState"] == "adopted"
    assert rsv(w, "rsv_acme")["state"] == "binding"  # as it was
    removed = w.ok("acme-admin", "nodes.remove", nodeId=w.ids["node_acme"], reason="retired")
    assert removed["provisionState"] == "removed"


@case("nodes.adopt")
def _nodes_adopt(w: World) -> None:
    with_fleet(w)
    new = w.ids["node_acme_new"]
    w.refused("globex-admin", "nodes.adopt", "not_found", nodeId=new, reason="fixed")
    w.refused("globex-admin", "nodes.adopt", "not_found", nodeId=new, tenantId="globex")
    w.refused("acme-admin", "nodes.adopt", "not_found", nodeId=new, tenantId="globex")
    w.refused("acme-admin", "nodes.adopt", "not_found", nodeId=w.ids["node_root"])
    for who in ("acme-member", "acme-ro", "root-member", "root-ro"):
        w.refused(who, "nodes.adopt", "permission_denied", nodeId=new, reason="fixed")
    assert node_state(w, "node_acme_new")["acceptance"]["attempt"] == 0
    adopted = w.ok("acme-admin", "nodes.adopt", nodeId=new, tenantId="acme", reason="fixed")
    assert adopted["acceptance"]["attempt"] == 1


@case("nodes.acceptInventory")
def _nodes_accept_inventory(w: World) -> None:
    """A node's hardware is the platform's: root administrators only, even for a node a
    tenant owns (nodes of tenant-owned pools)."""
    with_fleet(w)
    node = w.ids["node_acme"]
    for who in ("acme-admin", "acme-member", "acme-ro", "globex-admin", "root-member",
                "root-ro"):
        w.refused(who, "nodes.acceptInventory", "permission_denied", nodeId=node, reason="x")
    w.refused("root", "nodes.acceptInventory", "conflict", nodeId=node)  # nothing reported
    gpus = node_state(w, "node_acme")["gpus"]
    replaced = [*gpus[:-1], {**gpus[-1], "uuid": "GPU-replaced-after-repair"}]
    assert w.rt.services.inventory.reported(parse_id("node", node), 0, replaced)
    accepted = w.ok("root", "nodes.acceptInventory", nodeId=node, reason="GPU 7 replaced")
    assert accepted["gpus"][-1]["uuid"] == "GPU-replaced-after-repair"
    assert accepted["inventoryMismatch"] is None


# ------------------------------------------------------------------------ capacity


@case("capacity.get")
def _capacity_get(w: World) -> None:
    with_fleet(w)
    for who, pool in [("globex-admin", "pool_acme"), ("globex-member", "pool_root"),
                      ("acme-admin", "pool_root"), ("acme-ro", "pool_root")]:
        w.refused(who, "capacity.get", "not_found", poolId=w.ids[pool])
    for who in ("acme-ro", "globex-member"):
        seen = unchanged(w, who, "capacity.get", poolId=w.ids["pool_both"])
        assert seen["poolId"] == w.ids["pool_both"] and seen["resources"]["gpu"]["total"] == 16
        assert w.ids["node_both"] not in json.dumps(seen)  # figures, never root's node ids
    assert w.ok("root-ro", "capacity.get", poolId=w.ids["pool_root"])["poolId"] == \
        w.ids["pool_root"]
    # The quota shown is the caller's own tenant's: acme holds 3 GPUs of 16, globex 1 of 8.
    assert unchanged(w, "acme-ro", "capacity.get", poolId=w.ids["pool_both"])["quota"] == \
        {"tenantId": "acme", "gpu": 16, "inUse": 3}
    assert unchanged(w, "globex-member", "capacity.get", poolId=w.ids["pool_both"])["quota"] == \
        {"tenantId": "globex", "gpu": 8, "inUse": 1}


@case("capacity.history")
def _capacity_history(w: World) -> None:
    with_fleet(w)
    for who, pool in [("globex-admin", "pool_acme"), ("globex-member", "pool_root"),
                      ("acme-admin", "pool_root"), ("acme-ro", "pool_root")]:
        w.refused(who, "capacity.history", "not_found", poolId=w.ids[pool])
    w.refused(None, "capacity.history", "unauthenticated", poolId=w.ids["pool_both"])
    # A pool's figures, as capacity.get shows them to every tenant it is offered to: counts,
    # never another tenant's reservations or root's nodes.
    for who in ("acme-ro", "globex-member"):
        seen = unchanged(w, who, "capacity.history", poolId=w.ids["pool_both"], window="1h")
        assert seen["points"][-1]["total"] == 16 and seen["points"][-1]["allocated"] == 3
        shown = json.dumps(seen)
        assert not [i for i in ("node_both", "rsv_acme", "rsv_globex") if w.ids[i] in shown]
    assert w.ok("root-ro", "capacity.history", poolId=w.ids["pool_root"])["poolId"] == \
        w.ids["pool_root"]


@case("capacity.preview")
def _capacity_preview(w: World) -> None:
    with_fleet(w)
    ask = {"gpus": 1, "duration": "1h"}
    for who, pool in [("globex-member", "pool_acme"), ("acme-member", "pool_root"),
                      ("acme-ro", "pool_root")]:
        w.refused(who, "capacity.preview", "not_found", poolId=w.ids[pool], **ask)
    both = w.ids["pool_both"]
    w.refused("acme-member", "capacity.preview", "permission_denied", poolId=both,
              tenantId="globex", **ask)
    w.refused("globex-admin", "capacity.preview", "permission_denied", poolId=both,
              tenantId="acme", **ask)
    # Each tenant's quota use is its own: acme holds 3 GPUs, globex 1.
    acme = unchanged(w, "acme-ro", "capacity.preview", poolId=both, **ask)
    assert acme["fits"] is True and acme["quota"] == {"gpu": 16, "inUse": 3}
    globex = unchanged(w, "globex-member", "capacity.preview", poolId=both, **ask)
    assert globex["quota"] == {"gpu": 8, "inUse": 1}
    for_acme = w.ok("root-ro", "capacity.preview", poolId=both, tenantId="acme", **ask)
    assert for_acme["quota"] == acme["quota"]


# -------------------------------------------------------------------- reservations


def rsv(w: World, name: str) -> dict[str, Any]:
    return w.ok("root", "reservations.get", reservationId=w.ids[name])  # type: ignore[no-any-return]


@case("reservations.create")
def _reservations_create(w: World) -> None:
    with_fleet(w)
    both = w.ids["pool_both"]
    ask = {"gpus": 1, "duration": "1h"}
    w.refused("globex-member", "reservations.create", "not_found", poolId=w.ids["pool_acme"],
              **ask)
    w.refused("acme-member", "reservations.create", "not_found", poolId=w.ids["pool_root"],
              **ask)
    for who in ("acme-member", "acme-admin"):
        w.refused(who, "reservations.create", "permission_denied", poolId=both,
                  tenantId="globex", **ask)
    # Below member, and root tokens below admin acting for a tenant, book nothing.
    for who, tenant in [("acme-ro", None), ("root-ro", "acme"), ("root-member", "acme"),
                        ("root-member", "globex")]:
        extra = {"tenantId": tenant} if tenant else {}
        w.refused(who, "reservations.create", "permission_denied", poolId=both, **ask, **extra)
    # Keys are per tenant: globex's "rsv-1" is its own reservation, acme's is untouched.
    assert w.ids["rsv_globex"] != w.ids["rsv_acme"]
    assert (rsv(w, "rsv_acme")["tenantId"], rsv(w, "rsv_acme")["gpuCount"]) == ("acme", 2)
    again = w.ok("globex-member", "reservations.create", poolId=both, gpus=1, duration="2h",
                 key="rsv-1")
    assert again["id"] == w.ids["rsv_globex"] and again["tenantId"] == "globex"
    made = w.ok("root", "reservations.create", poolId=both, tenantId="acme", **ask)
    assert made["tenantId"] == "acme"  # a root administrator may act for a tenant


@case("reservations.get")
def _reservations_get(w: World) -> None:
    with_fleet(w)
    for who, name in [("globex-admin", "rsv_acme"), ("globex-member", "rsv_acme_later"),
                      ("acme-ro", "rsv_globex"), ("acme-admin", "rsv_globex")]:
        w.refused(who, "reservations.get", "not_found", reservationId=w.ids[name])
        w.refused(who, "reservations.get", "not_found", reservationId=w.ids[name],
                  tenantId=who.split("-")[0])
    assert unchanged(w, "acme-ro", "reservations.get",
                     reservationId=w.ids["rsv_acme"])["tenantId"] == "acme"
    assert w.ok("root-ro", "reservations.get", reservationId=w.ids["rsv_globex"])["id"] == \
        w.ids["rsv_globex"]


@case("reservations.list")
def _reservations_list(w: World) -> None:
    with_fleet(w)
    acme = {w.ids["rsv_acme"], w.ids["rsv_acme_later"]}
    for who in ("acme-ro", "acme-member"):
        assert {r["id"] for r in unchanged(w, who, "reservations.list")} == acme
    assert [r["id"] for r in w.ok("globex-member", "reservations.list")] == [w.ids["rsv_globex"]]
    assert w.ok("globex-admin", "reservations.list", poolId=w.ids["pool_acme"]) == []
    w.refused("acme-member", "reservations.list", "permission_denied", tenantId="globex")
    w.refused("globex-admin", "reservations.list", "permission_denied", tenantId="acme")
    w.refused("acme-admin", "reservations.list", "permission_denied", tenantId="root")
    assert {r["id"] for r in w.ok("root-ro", "reservations.list", tenantId="acme")} == acme
    assert w.ok("root", "reservations.list") == []  # root's own: none


def _refused_changes(w: World, method: str, name: str, **params: Any) -> None:
    """Another tenant cannot find it; its read-only token and root's non-admins may not."""
    target = {"reservationId": w.ids[name], **params}
    before = rsv(w, name)
    for who in ("globex-admin", "globex-member"):
        w.refused(who, method, "not_found", **target)
        w.refused(who, method, "not_found", **target, tenantId="globex")
    for who in ("acme-ro", "root-ro", "root-member"):
        w.refused(who, method, "permission_denied", **target)
    assert rsv(w, name) == before


@case("reservations.release")
def _reservations_release(w: World) -> None:
    with_fleet(w)
    _refused_changes(w, "reservations.release", "rsv_acme")
    w.refused("acme-member", "reservations.release", "not_found",
              reservationId=w.ids["rsv_globex"])
    assert rsv(w, "rsv_globex")["endedAt"] is None
    released = w.ok("acme-member", "reservations.release", reservationId=w.ids["rsv_acme"])
    assert released["state"] == "released"


@case("reservations.cancel")
def _reservations_cancel(w: World) -> None:
    with_fleet(w)
    _refused_changes(w, "reservations.cancel", "rsv_acme_later")
    cancelled = w.ok("acme-member", "reservations.cancel",
                     reservationId=w.ids["rsv_acme_later"])
    assert cancelled["state"] == "cancelled"


@case("reservations.extend")
def _reservations_extend(w: World) -> None:
    with_fleet(w)
    _refused_changes(w, "reservations.extend", "rsv_acme", by="30m")
    w.refused("acme-member", "reservations.extend", "not_found",
              reservationId=w.ids["rsv_globex"], by="30m")
    before = rsv(w, "rsv_acme")["end"]
    extended = w.ok("acme-member", "reservations.extend", reservationId=w.ids["rsv_acme"],
                    by="30m")  # rsv_acme_later starts after the new end
    assert extended["end"] > before


# --------------------------------------------------------------------------- usage


@case("usage.report")
def _usage_report(w: World) -> None:
    with_fleet(w)
    window = {"from": "-1d", "to": "+1d"}
    for who, tenant in [("acme-ro", "globex"), ("acme-admin", "root"),
                        ("globex-member", "acme")]:
        w.refused(who, "usage.report", "permission_denied", tenantId=tenant, **window)
    w.refused("globex-member", "usage.report", "not_found", poolId=w.ids["pool_acme"], **window)
    w.refused(None, "usage.report", "unauthenticated", **window)
    every = unchanged(w, "root-ro", "usage.report", **window)
    assert {r["tenantId"] for r in every["rows"]} == {"acme", "globex"}
    for who, tenant in [("acme-ro", "acme"), ("globex-member", "globex")]:
        own = unchanged(w, who, "usage.report", by="tenant,pool,day", **window)
        assert {r["tenantId"] for r in own["rows"]} == {tenant} and own["tenantId"] == tenant
        assert own["total"]["reservations"] == 1  # rsv_acme_later has not started
        text = json.dumps(own)
        other = "globex" if tenant == "acme" else "acme"
        assert other not in text and w.ids[f"rsv_{other}"] not in text
    assert w.ok("root", "usage.report", tenantId="acme", **window)["rows"][0]["tenantId"] == \
        "acme"


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


ROLE_MATRIX: list[tuple[str, Callable[[World], dict[str, Any]]]] = [
    # (method, params) that every token below admin, of any tenant, must be refused
    ("tokens.create", lambda w: {"role": "read-only"}),
    ("sites.create", lambda w: {"kind": "shared", "region": "eu-9", "key": "role-site"}),
    ("pools.create", lambda w: {"siteId": w.ids["site_shared"], "class": "metal-host",
                                "gpuModel": "H100", "policy": POLICY}),
    ("pools.offer", lambda w: {"poolId": w.ids["pool_both"], "toTenantId": "globex",
                               "quota": {"gpu": 1}}),
    ("tenants.create", lambda w: {"tenantId": "initech"}),
    ("joinTokens.create", lambda w: {"poolId": w.ids["pool_both"], "ttl": "2h"}),
    ("projections.rebuild", lambda w: {}),
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


WATCHERS = ("acme-ro", "acme-admin", "globex-member", "root-ro")


def test_watch_streams_only_the_events_each_tenant_lists(env: dict[str, str]) -> None:
    """The /watch row of the matrix: streams of every tenant, live before the fleet's events
    are written (so they come from the live window, not a read of the store), with and
    without a type filter, each carry exactly what the same token lists with events.list."""
    rt = initialized_runtime({**env, "BETTER_COMPUTE_WATCH_HEARTBEAT": "0.2"})
    try:
        w = build_world(rt)
        start = w.head()
        queries = {(who, types): f"since={start}" + (f"&types={types}" if types else "")
                   for who in WATCHERS for types in ("", "reservation.*,node.*,quota.*")}
        streams = {key: Stream(w.tokens[key[0]], query) for key, query in queries.items()}
        listed: dict[tuple[str, str], list[dict[str, Any]]] = {}

        def list_events() -> None:
            for who, types in streams:
                listed[(who, types)] = w.ok(who, "events.list", since=start, limit=1000,
                                            **({"types": types} if types else {}))["events"]

        async def main() -> None:
            async with serving_app(rt) as app, anyio.create_task_group() as tg:
                for stream in streams.values():
                    tg.start_soon(stream.run, app)
                for stream in streams.values():
                    await stream.wait_for(lambda line: line.get("heartbeat"))
                await anyio.to_thread.run_sync(lambda: with_fleet(w))
                head = w.head()
                for stream in streams.values():  # each read up to the head
                    await stream.wait_for(lambda line: line.get("head", 0) >= head)
                await anyio.to_thread.run_sync(list_events)
                tg.cancel_scope.cancel()

        anyio.run(main)
        for (who, types), stream in streams.items():
            got = [line for line in stream.lines if "sequence" in line]
            events = listed[(who, types)]
            assert [e["sequence"] for e in got] == [e["sequence"] for e in events], (who, types)
            assert events, (who, types)  # the fleet gave every tenant events to see
            tenant = who.split("-")[0]
            if tenant != "root":
                assert {e["tenantId"] for e in got} == {tenant}, (who, types)
                other = "globex" if tenant == "acme" else "acme"
                assert w.ids[f"rsv_{other}"] not in json.dumps(got)
    finally:
        rt.close()
