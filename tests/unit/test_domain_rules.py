"""Rules that live in the domain: who may act on a tenant, what a site, a pool class and a
reservation may be, and what a node's binding must match (pure: no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import Conflict, InvalidInput, PermissionDenied
from better_compute.domain.pool import check_node_class
from better_compute.domain.reservation_rules import (
    MAX_DURATION,
    MAX_GPUS,
    cdi_devices,
    check_bound_devices,
    check_extension,
    check_gpu_count,
    check_length,
)
from better_compute.domain.site import check_new_site

ROOT_ADMIN = Principal("root", Role.ADMIN, "tok_root")
ROOT_MEMBER = Principal("root", Role.MEMBER, "tok_rm")
ACME_ADMIN = Principal("acme", Role.ADMIN, "tok_aa")
ACME_MEMBER = Principal("acme", Role.MEMBER, "tok_am")
ACME_READER = Principal("acme", Role.parse("read-only"), "tok_ar")
START = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("principal", [ROOT_ADMIN, ACME_ADMIN, ACME_MEMBER])
def test_members_admins_and_root_admins_act_for_the_tenant(principal: Principal) -> None:
    principal.require_member_of("acme", "reserve GPUs")


@pytest.mark.parametrize(("principal", "says"), [
    (ROOT_MEMBER, "cannot reserve GPUs for tenant acme: use a token of tenant acme"),
    (Principal("beta", Role.ADMIN, "tok_b"), "belongs to tenant beta"),
    (ACME_READER, "needs the member role"),
])
def test_others_are_refused_with_the_fix(principal: Principal, says: str) -> None:
    with pytest.raises(PermissionDenied, match=says):
        principal.require_member_of("acme", "reserve GPUs")


def test_admin_of_needs_the_admin_role_where_member_of_does_not() -> None:
    ACME_MEMBER.require_member_of("acme", "x")
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        ACME_MEMBER.require_admin_of("acme", "offer pools")
    with pytest.raises(PermissionDenied, match="belongs to tenant acme"):
        ACME_ADMIN.require_admin_of("beta", "offer pools")


def test_a_call_acts_on_the_callers_tenant_or_any_for_the_root_tenant() -> None:
    ROOT_MEMBER.require_can_act_on("acme")
    ACME_READER.require_can_act_on("acme")
    with pytest.raises(PermissionDenied, match="BETTER_COMPUTE_TENANT=acme"):
        ACME_ADMIN.require_can_act_on("beta")


@pytest.mark.parametrize(("principal", "kind", "region", "error", "says"), [
    (ROOT_ADMIN, "colo", "eu-1", InvalidInput, "use shared or dedicated"),
    (ACME_ADMIN, "shared", "eu-1", PermissionDenied, "only the root tenant creates"),
    (ROOT_MEMBER, "shared", "eu-1", PermissionDenied, "only a root administrator"),
    (ROOT_ADMIN, "shared", "eu 1!", InvalidInput, "is not a region name"),
    (ROOT_ADMIN, "shared", "", InvalidInput, "region"),
])
def test_new_sites_are_checked(principal: Principal, kind: str, region: str,
                               error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        check_new_site(principal, kind, region, None)


def test_a_good_site_and_pool_class_pass() -> None:
    check_new_site(ROOT_ADMIN, "dedicated", "eu_2-a", "Frankfurt")
    check_node_class("metal-host")
    with pytest.raises(InvalidInput, match="is not a pool class: use metal-host"):
        check_node_class("vm")


@pytest.mark.parametrize("gpus", [0, -1, MAX_GPUS + 1, True, 2.0, "4"])
def test_gpu_counts_are_whole_numbers_in_range(gpus: Any) -> None:
    with pytest.raises(InvalidInput, match=f"use a whole number from 1 to {MAX_GPUS}"):
        check_gpu_count(gpus)


def test_gpu_count_bounds_pass() -> None:
    assert check_gpu_count(1) == 1 and check_gpu_count(MAX_GPUS) == MAX_GPUS


def test_lengths_and_extensions_stay_within_366_days() -> None:
    check_length(timedelta(minutes=1), "1m")
    check_length(MAX_DURATION, "366d")
    for length, text in ((timedelta(seconds=59), "59s"), (MAX_DURATION + timedelta(1), "367d")):
        with pytest.raises(InvalidInput, match=f"--for {text} is out of range"):
            check_length(length, text)
    check_extension(START, START + MAX_DURATION)
    with pytest.raises(InvalidInput, match="at most 366d"):
        check_extension(START, START + MAX_DURATION + timedelta(seconds=1))


def test_a_binding_names_exactly_the_booked_devices() -> None:
    booked = ["GPU-b", "GPU-a"]
    check_bound_devices("node_1", "alloc_1", "rsv_1", booked, reversed(cdi_devices(booked)))
    for bound in ([], cdi_devices(["GPU-a"]), cdi_devices(["GPU-a", "GPU-b", "GPU-c"]),
                  ["bcd.dev/gpu=GPU-a", "bcd.dev/gpu=GPU-x"]):
        with pytest.raises(Conflict, match="node node_1 bound alloc_1 with devices"):
            check_bound_devices("node_1", "alloc_1", "rsv_1", booked, bound)
