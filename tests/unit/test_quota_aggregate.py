"""QuotaUse: an offered tenant's gpu quota is never exceeded; release refunds."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from better_compute.domain.errors import QuotaExceeded
from better_compute.domain.quota import QuotaUse, quota_uuid


def test_take_refuses_past_the_quota_and_says_what_is_available() -> None:
    q = QuotaUse(tenant_id="acme", pool_id="pool_a")
    assert q.id == quota_uuid("pool_a", "acme")
    q.take("rsv_1", 12, 16)
    with pytest.raises(QuotaExceeded) as err:
        q.take("rsv_2", 8, 16)
    assert "gpu quota of 16, holds 12 and asked for 8; 4 are available now" in err.value.message
    assert err.value.data == {"quota": 16, "inUse": 12, "requested": 8, "available": 4}
    q.take("rsv_1", 12, 16)  # the same reservation again counts once
    assert q.in_use == 12
    assert q.refund("rsv_1") and not q.refund("rsv_1")
    q.take("rsv_2", 16, 16)
    assert q.in_use == 16


def test_no_limit_is_unlimited() -> None:
    q = QuotaUse(tenant_id="root", pool_id="pool_a")
    q.take("rsv_1", 10_000, None)
    assert q.in_use == 10_000


@settings(max_examples=150, deadline=None)
@given(limit=st.integers(0, 20),
       steps=st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(1, 8)),
                      max_size=50))
def test_in_use_never_exceeds_the_quota(limit: int, steps: list[tuple[bool, int, int]]) -> None:
    q = QuotaUse(tenant_id="acme", pool_id="pool_a")
    for take, n, gpus in steps:
        if take:
            with contextlib.suppress(QuotaExceeded):
                q.take(f"rsv_{n}", gpus, limit)
        else:
            q.refund(f"rsv_{n}")
        assert 0 <= q.in_use <= limit
