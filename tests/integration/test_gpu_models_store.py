"""One table of GPU models (domain/gpu_models.py) through the store, on SQLite and PostgreSQL:
a pool's ``--gpu-model``, the model of the GPUs bcd reports and a reservation's ``--model``
agree; distinct GPUs stay distinct; an unknown GPU still makes a pool; a pool stored with an
older spelling still loads (docs/gpu-models.md)."""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.api.runtime import Runtime
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import InvalidInput, NoCapacity
from better_compute.domain.ids import new_uuid
from better_compute.domain.pool import Pool
from tests.fleet import add_nodes
from tests.support import open_runtime

ADA = "NVIDIA RTX 6000 Ada Generation"  # what NVML reports for the card
POLICY = {"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 4}}


def site(rt: Any, key: str = "site-a") -> str:
    return str(rt.service.sites_create(OP, "shared", "eu-1", None, key)["id"])


def pool(rt: Any, site_id: str, model: str, key: str) -> dict[str, Any]:
    return rt.service.pools_create(  # type: ignore[no-any-return]
        OP, site_id, "metal-host", model, POLICY, None, key)


def reserve(rt: Any, pool_id: str, gpus: int, **kw: Any) -> dict[str, Any]:
    return rt.services.reservations.create(  # type: ignore[no-any-return]
        OP, tenant_id=None, pool_id=pool_id, gpus=gpus, duration="2h", **kw)


def test_a_node_reporting_the_rtx_6000_ada_is_reserved_by_the_spelling_the_docs_show(
        runtime: Any) -> None:
    made = pool(runtime, site(runtime), "RTX 6000 Ada", "ada")
    assert made["gpuModel"] == "RTX 6000 Ada"
    add_nodes(runtime.service, made["id"], 1, gpus=4, gpu_name=ADA)
    for spelling in ("RTX 6000 Ada", "rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation",
                     "RTX_6000_ADA"):
        placed = reserve(runtime, made["id"], 1, model=spelling)
        assert placed["state"] in ("placed", "active"), placed


def test_distinct_rtx_6000_cards_are_distinct_pool_models(runtime: Any) -> None:
    at = site(runtime)
    models = {spelling: pool(runtime, at, spelling, f"p{i}")["gpuModel"] for i, spelling in
              enumerate(["RTX 6000 Ada", "RTX A6000", "Quadro RTX 6000", "RTX PRO 6000"])}
    assert models == {"RTX 6000 Ada": "RTX 6000 Ada", "RTX A6000": "RTX A6000",
                      "Quadro RTX 6000": "Quadro RTX 6000", "RTX PRO 6000": "RTX PRO 6000"}
    with pytest.raises(InvalidInput) as err:  # "RTX 6000" alone could be any of the four
        pool(runtime, at, "RTX 6000", "p9")
    assert all(name in str(err.value) for name in models)


def test_a_model_of_another_card_never_books_the_pools_gpus(runtime: Any) -> None:
    made = pool(runtime, site(runtime), "RTX 6000 Ada", "ada")
    add_nodes(runtime.service, made["id"], 1, gpus=4, gpu_name=ADA)
    for other in ("RTX A6000", "Quadro RTX 6000", "RTX PRO 6000"):
        with pytest.raises(InvalidInput) as err:
            reserve(runtime, made["id"], 1, model=other)
        assert "does not match pool" in str(err.value)


def test_an_unknown_gpu_makes_a_pool_by_the_name_its_driver_reports(runtime: Any) -> None:
    made = pool(runtime, site(runtime), "NVIDIA B40", "b40")
    assert made["gpuModel"] == "NVIDIA B40"
    add_nodes(runtime.service, made["id"], 1, gpus=2, gpu_name="NVIDIA B40")
    assert reserve(runtime, made["id"], 2, model="nvidia b40")["state"] in ("placed", "active")


def test_an_unknown_gpu_is_never_read_as_a_known_one(runtime: Any) -> None:
    made = pool(runtime, site(runtime), "H100", "h100")
    add_nodes(runtime.service, made["id"], 1, gpus=2, gpu_name="NVIDIA H1000 Ultra")
    with pytest.raises(NoCapacity):
        reserve(runtime, made["id"], 1, model="H100")


def test_a_pool_stored_with_the_old_compact_name_still_loads(
        env: dict[str, str], runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before one table, ``--gpu-model "RTX 6000 Ada"`` was stored as ``RTX6000``: such a
    ``pool.created`` (class version 1) reads as the RTX 6000 Ada."""
    at = site(runtime)
    legacy = Pool.with_id(new_uuid(), tenant_id="root", site_id=at, node_class="metal-host",
                          gpu_model="RTX6000", policy=POLICY, name="", key=None,
                          fingerprint=None)
    with monkeypatch.context() as patch:  # written the way the older code wrote it
        patch.setattr(Pool.Created, "class_version", 1, raising=False)
        runtime.store.save(legacy)
    fresh: Runtime = open_runtime(env)
    try:
        doc = fresh.service.pools_get(OP, legacy.public_id)
        assert doc["gpuModel"] == "RTX 6000 Ada"
        add_nodes(fresh.service, legacy.public_id, 1, gpus=4, gpu_name=ADA)
        placed = reserve(fresh, legacy.public_id, 2, model="RTX 6000 Ada")
        assert placed["state"] in ("placed", "active")
        listed = [p for p in fresh.service.pools_list(OP, None) if p["id"] == legacy.public_id]
        assert [p["gpuModel"] for p in listed] == ["RTX 6000 Ada"]
    finally:
        fresh.close()
