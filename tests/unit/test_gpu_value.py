"""The domain's ``Gpu`` value: a node's GPU document read once, its health rule defined once.

bcd cannot import the domain (it ships with api/wire/ only), so the wire's ``Gpu.is_healthy``
states the same rule; the property test holds the two equal.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from better_compute.api.wire import inventory as wire
from better_compute.domain.gpus import Gpu, gpu_is_healthy, gpus_of, with_health

H100 = {"index": 3, "uuid": "GPU-3", "name": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559,
        "nvlinkDomain": "sw0", "serial": "123"}


def test_a_gpu_with_no_word_on_its_health_is_healthy() -> None:
    gpu = Gpu.from_doc(H100)
    assert gpu.healthy and gpu.health_reasons == () and gpu.health() == (True, ())
    assert (gpu.uuid, gpu.index, gpu.memory_mib, gpu.nvlink_domain) == ("GPU-3", 3, 81559, "sw0")
    assert gpu.model == "H100"  # from the name when bcd named no family


def test_reported_unhealthy_or_any_reason_makes_it_unhealthy() -> None:
    assert not Gpu.from_doc({**H100, "healthy": False}).healthy
    sick = Gpu.from_doc({**H100, "healthy": True, "healthReasons": ["xid-79", "ecc"]})
    assert not sick.healthy
    assert sick.why_unhealthy == "xid-79, ecc"
    assert sick.health() == (False, ("xid-79", "ecc"))
    assert Gpu.from_doc({**H100, "healthy": False}).why_unhealthy == "unhealthy"


def test_odd_fields_read_as_unknown_never_as_an_error() -> None:
    gpu = Gpu.from_doc({"uuid": "GPU-x", "index": True, "memoryMiB": "80GB", "healthReasons": "x"})
    assert (gpu.index, gpu.memory_mib, gpu.name, gpu.model) == (None, None, "", None)
    assert gpu.health_reasons == ("x",) and not gpu.healthy
    assert Gpu.from_doc({}).uuid == ""


def test_a_health_change_keeps_every_other_field() -> None:
    sick = with_health(H100, False, ["xid-79"])
    assert sick == {**H100, "healthy": False, "healthReasons": ["xid-79"]}
    assert with_health(sick, True, ["ignored"]) == {**H100, "healthy": True, "healthReasons": []}
    assert [g.healthy for g in gpus_of([sick, H100])] == [False, True]


@given(healthy=st.one_of(st.none(), st.booleans()),
       reasons=st.one_of(st.none(), st.lists(st.sampled_from(["xid-79", "gpu-lost"]),
                                             max_size=2)))
def test_the_domain_and_the_wire_state_the_same_rule(healthy: bool | None,
                                                     reasons: list[str] | None) -> None:
    doc: dict[str, Any] = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100"}
    if healthy is not None:
        doc["healthy"] = healthy
    if reasons is not None:
        doc["healthReasons"] = reasons
    on_the_wire = msgspec.convert(doc, wire.Gpu)
    assert on_the_wire.is_healthy == gpu_is_healthy(doc) == Gpu.from_doc(doc).healthy
    assert Gpu.from_doc(msgspec.to_builtins(on_the_wire)).healthy == on_the_wire.is_healthy


ODD = st.one_of(st.none(), st.booleans(), st.integers(-1, 2), st.sampled_from(["", "x"]),
                st.lists(st.sampled_from(["", "xid-79"]), max_size=2))


@given(healthy=st.one_of(st.just("absent"), ODD), reasons=st.one_of(st.just("absent"), ODD))
def test_the_documents_health_read_directly_is_the_values(healthy: Any, reasons: Any) -> None:
    """``gpu_is_healthy`` reads a document without making the value (on every event of a
    node): for any document, stored or odd, it says what ``Gpu.from_doc`` says."""
    doc: dict[str, Any] = {"uuid": "GPU-0"}
    if healthy != "absent":
        doc["healthy"] = healthy
    if reasons != "absent":
        doc["healthReasons"] = reasons
    assert gpu_is_healthy(doc) == Gpu.from_doc(doc).healthy
