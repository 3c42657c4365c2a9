"""Each installation mints its keyed ids in its own namespace.

Two clusters built by the same script (same tenants, same ``--key``s) must not
mint the same ``site_…``, ``pool_…``, ``jt_…`` and ``rsv_…`` ids for different
objects, or an id copied from one silently names an object in the other.
``init`` draws a random installation id, kept with the PKI bundle, and
keyed ids derive from it; a retry with the same key on the same store still
lands on the same object, and a store whose PKI bundle has no installation id
keeps minting (and reading) the ids it always had.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from better_compute.api import pki
from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.ids import keyed_uuid, public_id
from better_compute.domain.pki import PkiBundle
from tests.fleet import add_nodes
from tests.support import POLICY, drop_schema, open_runtime, quick_init, store_env


@pytest.fixture
def two_stores(backend: str, tmp_path: Path) -> Iterator[tuple[Runtime, Runtime]]:
    envs = [store_env(backend, tmp_path / name) for name in ("a", "b")]
    runtimes = [open_runtime(e) for e in envs]
    try:
        yield runtimes[0], runtimes[1]
    finally:
        for rt, e in zip(runtimes, envs, strict=True):
            rt.close()
            drop_schema(e)


def build_by_script(rt: Runtime) -> dict[str, str]:
    """The same script an operator runs on every cluster: every create carries a --key."""
    service = rt.service
    site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, "site-eu-1")["id"]
    pool = service.pools_create(LOCAL_OPERATOR, site, "metal-host", "H100", POLICY, None,
                                "pool-eu-1-h100")["id"]
    add_nodes(service, pool, 1)
    jt = rt.services.join.create(LOCAL_OPERATOR, pool, "2h", 1, "SN-7701", None, None,
                                 "join-sn-7701")["id"]
    rsv = rt.services.reservations.create(LOCAL_OPERATOR, tenant_id=None, pool_id=pool, gpus=1,
                                       duration="1h", key="train-1")["id"]
    return {"site": site, "pool": pool, "jt": jt, "rsv": rsv}


def test_two_installations_built_by_one_script_mint_different_ids(
        two_stores: tuple[Runtime, Runtime]) -> None:
    a, b = two_stores
    quick_init(a)
    quick_init(b)
    ids_a, ids_b = build_by_script(a), build_by_script(b)
    for kind in ids_a:
        assert ids_a[kind] != ids_b[kind], f"both clusters minted {ids_a[kind]}"
    # The same script again on the same store: the same objects (idempotency keys hold).
    assert build_by_script(a) == ids_a
    # An id of one cluster names nothing in the other.
    doc: dict[str, Any] = b.service.sites_get(LOCAL_OPERATOR, ids_b["site"])
    assert doc["id"] == ids_b["site"]
    with pytest.raises(Exception) as err:
        b.service.sites_get(LOCAL_OPERATOR, ids_a["site"])
    assert getattr(err.value, "code", None) == "not_found"


def test_a_store_initialized_before_namespaces_keeps_its_ids(
        two_stores: tuple[Runtime, Runtime]) -> None:
    legacy, _ = two_stores
    bundle = pki.generate_bundle()
    sealed = pki.seal_bundle(bundle, pki.parse_master_key(pki.new_master_key()))
    legacy.store.save(PkiBundle(tenant_id="root", public=pki.public_parts(bundle),
                                sealed=sealed), actor="local")  # as init wrote it before: no installation id
    site = legacy.service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, "site-eu-1")
    assert site["id"] == public_id("site", keyed_uuid("root", "site", "site-eu-1"))
    assert legacy.service.sites_get(LOCAL_OPERATOR, site["id"])["key"] == "site-eu-1"
