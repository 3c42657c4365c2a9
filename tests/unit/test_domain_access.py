"""Roles and principals: who may do what, decided without any I/O."""

from __future__ import annotations

import pytest

from better_compute.domain.access import LOCAL_OPERATOR, ROOT_TENANT, Principal, Role
from better_compute.domain.errors import InvalidInput, PermissionDenied


@pytest.mark.parametrize("text,role", [
    ("admin", Role.ADMIN), ("tenant-admin", Role.ADMIN), ("root-admin", Role.ADMIN),
    ("member", Role.MEMBER), ("read-only", Role.READ_ONLY), ("readonly", Role.READ_ONLY),
    ("viewer", Role.READ_ONLY),
])
def test_role_names_and_aliases(text: str, role: Role) -> None:
    assert Role.parse(text) is role


@pytest.mark.parametrize("text", ["owner", "Admin", "", "root"])
def test_unknown_roles_list_the_known_ones(text: str) -> None:
    with pytest.raises(InvalidInput, match="admin, member, read-only"):
        Role.parse(text)


def test_roles_are_ordered() -> None:
    assert Role.ADMIN.rank > Role.MEMBER.rank > Role.READ_ONLY.rank


def test_the_local_operator_is_a_root_administrator() -> None:
    assert LOCAL_OPERATOR.tenant_id == ROOT_TENANT == "root"
    assert LOCAL_OPERATOR.is_root_admin and LOCAL_OPERATOR.token_id is None


def test_only_admins_of_root_are_root_administrators() -> None:
    assert not Principal("root", Role.MEMBER).is_root_admin
    assert Principal("root", Role.READ_ONLY).is_root
    assert not Principal("acme", Role.ADMIN).is_root_admin
    assert not Principal("acme", Role.ADMIN).is_root


def test_a_tenant_sees_only_itself_and_root_sees_all() -> None:
    acme = Principal("acme", Role.ADMIN)
    assert acme.can_see_tenant("acme")
    assert not acme.can_see_tenant("globex") and not acme.can_see_tenant("root")
    assert Principal("root", Role.READ_ONLY).can_see_tenant("acme")


def test_require_admin_of() -> None:
    Principal("acme", Role.ADMIN).require_admin_of("acme", "create tokens")
    LOCAL_OPERATOR.require_admin_of("acme", "create tokens")
    with pytest.raises(PermissionDenied, match="belongs to tenant acme"):
        Principal("acme", Role.ADMIN).require_admin_of("globex", "create tokens")
    with pytest.raises(PermissionDenied, match="needs the admin role"):
        Principal("acme", Role.MEMBER).require_admin_of("acme", "create tokens")
    # A root token below admin does not administer other tenants either.
    with pytest.raises(PermissionDenied):
        Principal("root", Role.MEMBER).require_admin_of("acme", "create tokens")


def test_require_root_admin_names_the_token() -> None:
    with pytest.raises(PermissionDenied, match="read-only on tenant root"):
        Principal("root", Role.READ_ONLY).require_root_admin("create tenants")
    LOCAL_OPERATOR.require_root_admin("create tenants")


def test_require_role() -> None:
    Principal("acme", Role.MEMBER).require_role(Role.READ_ONLY, "read")
    with pytest.raises(PermissionDenied, match="ask an admin"):
        Principal("acme", Role.READ_ONLY).require_role(Role.MEMBER, "reserve")
