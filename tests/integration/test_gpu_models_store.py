"""One table of GPU models (domain/gpu_models.py) through the store, on SQLite and PostgreSQL:
a pool's ``--gpu-model``, the model of the GPUs bcd reports and a reservation's ``--model``
agree; distinct GPUs stay distinct; an unknown GPU still makes a pool; a pool stored with an
older spelling still loads (docs/gpu-models.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from better_compute.api.runtime import Runtime
from better_compute.api.services import compute
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import Conflict, InvalidInput, NoCapacity
from better_compute.domain.ids import parse_id
from better_compute.domain.pool import Pool
from tests.fleet import add_nodes
from tests.support import cli_inprocess, open_runtime

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
    """Class version 1 stored ``--gpu-model "RTX 6000 Ada"`` as ``RTX6000``: such a
    ``pool.created`` (class version 1) reads as the RTX 6000 Ada, and the same create retried
    with its key returns that pool."""
    at = site(runtime)
    with monkeypatch.context() as patch:  # written the way the older code wrote it
        patch.setattr(compute, "parse_gpu_model", lambda text: "RTX6000")
        patch.setattr(Pool.Created, "class_version", 1, raising=False)
        legacy = pool(runtime, at, "RTX 6000 Ada", "old-ada")
    [stored] = runtime.store.recorder.select_events(parse_id("pool", legacy["id"]))
    assert b'"RTX6000"' in stored.state and b"class_version" not in stored.state
    fresh: Runtime = open_runtime(env)
    try:
        doc = fresh.service.pools_get(OP, legacy["id"])
        assert doc["gpuModel"] == "RTX 6000 Ada"
        assert pool(fresh, at, "RTX 6000 Ada", "old-ada")["id"] == legacy["id"]  # a retry
        with pytest.raises(Conflict):  # the key still guards its parameters
            pool(fresh, at, "RTX A6000", "old-ada")
        add_nodes(fresh.service, legacy["id"], 1, gpus=4, gpu_name=ADA)
        placed = reserve(fresh, legacy["id"], 2, model="RTX 6000 Ada")
        assert placed["state"] in ("placed", "active")
        listed = [p for p in fresh.service.pools_list(OP, None) if p["id"] == legacy["id"]]
        assert [p["gpuModel"] for p in listed] == ["RTX 6000 Ada"]
    finally:
        fresh.close()
    code, out, err = cli_inprocess(["events", "list", "--subject", legacy["id"], "-o", "json"], env)
    created = [json.loads(line) for line in out.splitlines() if '"pool.created"' in line]
    assert code == 0 and [e["data"]["gpuModel"] for e in created] == ["RTX 6000 Ada"], err
