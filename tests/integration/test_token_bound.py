"""A tenant's live API tokens are bounded (``tokens.max_per_tenant``).

Each token has its own share of a server's workers (api/http/http_limits.py) and its own
aggregate and listing row; before this bound a tenant admin could mint as many as it liked.
Now a create past the bound is refused with ``quota_exceeded`` (``data.per``: ``tokens``)
and changes nothing; revoked and expired tokens do not count; other tenants are not
affected; the root tenant (the platform's operators) is not bounded.
"""

from __future__ import annotations

from typing import Any

import pytest

from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.access import Principal, Role
from better_compute.domain.errors import QuotaExceeded
from tests.support import open_runtime, quick_init

BOUND = 3


@pytest.fixture
def bounded(env: dict[str, str]) -> Any:
    rt = open_runtime({**env, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT": str(BOUND)})
    quick_init(rt)
    for tenant in ("acme", "beta"):
        rt.service.tenants_create(OP, tenant, None)
    yield rt
    rt.close()


def test_a_tenant_holds_at_most_the_bound_of_live_tokens(bounded: Any) -> None:
    tokens = bounded.services.tokens
    admin_doc = tokens.create(OP, "acme", "admin", "admin")
    admin = Principal("acme", Role.ADMIN, admin_doc["id"])
    made = [admin_doc] + [tokens.create(admin, None, "member", f"ci {n}")
                          for n in range(BOUND - 1)]
    head = bounded.store.recorder.max_notification_id()

    with pytest.raises(QuotaExceeded) as refused:
        tokens.create(admin, None, "member", "one too many")
    assert refused.value.data == {"per": "tokens", "tokens": BOUND, "limit": BOUND}
    assert f"tenant acme already has {BOUND} live tokens" in refused.value.message
    assert "tokens.max_per_tenant" in refused.value.message
    assert "tokens revoke" in refused.value.message  # the fix
    assert bounded.store.recorder.max_notification_id() == head  # nothing changed

    # Another tenant, and root, are not held back.
    tokens.create(OP, "beta", "member", None)
    assert all(tokens.create(OP, None, "member", None) for _ in range(BOUND + 1))

    # A revoked token's place comes back.
    tokens.revoke(admin, made[-1]["id"])
    assert tokens.create(admin, None, "member", "again")["tenantId"] == "acme"


def test_expired_tokens_do_not_count(bounded: Any) -> None:
    tokens = bounded.services.tokens
    for n in range(BOUND):
        tokens.create(OP, "acme", "member", f"short {n}", ttl="1m")
    clock = bounded.service.clock
    later = clock() + __import__("datetime").timedelta(minutes=2)
    bounded.service.clock = lambda: later
    try:
        assert tokens.create(OP, "acme", "member", "after")["state"] == "active"
    finally:
        bounded.service.clock = clock


def test_zero_is_no_bound(env: dict[str, str]) -> None:
    rt = open_runtime({**env, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT": "0"})
    try:
        quick_init(rt)
        rt.service.tenants_create(OP, "acme", None)
        assert all(rt.services.tokens.create(OP, "acme", "member", None)
                   for _ in range(BOUND + 2))
    finally:
        rt.close()
