"""reservations.list in pages: a call answers at most ``limit`` (at most 1,000) reservations.

Unpaged, a call would answer the tenant's whole history: 5,000 reservations are 3.5 MB of
JSON and ~75 ms of the server's CPU per call, growing with every reservation a member makes,
so repeated lists by one tenant would slow the server for all. A call answers
at most ``limit`` (default and most ``MAX_PAGE`` (domain/paging.py)) after the reservation ``after``, oldest
first; a page shorter than ``limit`` is the last. The CLI pages through, so `reservations
list` still prints every one. Here the page is made small (3) to show it with 7.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from better_compute.cli import context
from better_compute.domain import paging
from better_compute.domain.access import LOCAL_OPERATOR as OP
from better_compute.domain.errors import InvalidInput
from better_compute.domain.ids import public_id
from tests.integration.test_reservations_cli import cli, prepared
from tests.integration.test_reservations_service import ACME, reserve, setup

PAGE = 3
GHOST = public_id("rsv", uuid.UUID(int=7))  # well formed, never made (fixed: test ids)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "MAX_PAGE", PAGE)
    monkeypatch.setattr(context, "PAGE", PAGE)


def test_a_call_answers_one_page_and_after_reads_on(runtime: Any, small_pages: None) -> None:
    rs, _, pool, _ = setup(runtime, nodes=2, quota=16)
    made = [reserve(rs, pool, 1, who=ACME, duration="1h")["id"] for _ in range(7)]
    assert [r["id"] for r in rs.list(ACME, None, None, None)] == made[:PAGE]  # the default
    pages, after = [], None
    while True:
        page = rs.list(ACME, None, None, None, limit=PAGE, after=after)
        pages.append([r["id"] for r in page])
        if len(page) < PAGE:
            break
        after = page[-1]["id"]
    assert pages == [made[:3], made[3:6], made[6:]]
    assert [r["id"] for r in rs.list(ACME, None, None, None, limit=2, after=made[1])] == \
        made[2:4]
    # Filters page the same way: only what matches counts.
    rs.release(ACME, made[0])
    rs.release(ACME, made[4])
    released = rs.list(ACME, None, None, "released", limit=PAGE)
    assert [r["id"] for r in released] == [made[0], made[4]]


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"limit": 0}, "limit 0: ask for 1 to 3"),
    ({"limit": PAGE + 1}, f"limit {PAGE + 1}: ask for 1 to 3"),
    ({"after": GHOST}, f"after: no reservation {GHOST} of tenant acme"),
    ({"after": "nonsense"}, "nonsense"),
])
def test_a_bad_page_is_refused_with_the_fix(runtime: Any, small_pages: None,
                                            kwargs: dict[str, Any], says: str) -> None:
    rs, _, pool, _ = setup(runtime, nodes=1, quota=4)
    reserve(rs, pool, 1, who=ACME, duration="1h")
    with pytest.raises(InvalidInput) as refused:
        rs.list(ACME, None, None, None, **kwargs)
    assert says in refused.value.message


def test_after_names_a_reservation_of_the_tenant_listed(runtime: Any, small_pages: None) -> None:
    """Another tenant's reservation is not a position in this tenant's list (nor a way to
    learn that it exists: the refusal is the same as for one that does not)."""
    rs, _, pool, _ = setup(runtime, nodes=1, quota=4)
    others = reserve(rs, pool, 1, duration="1h")["id"]  # root's
    reserve(rs, pool, 1, who=ACME, duration="1h")
    with pytest.raises(InvalidInput, match=f"after: no reservation {others} of tenant acme"):
        rs.list(ACME, None, None, None, after=others)
    assert rs.list(OP, None, None, None, after=others) == []


def test_the_cli_pages_through_every_reservation(env: dict[str, str], small_pages: None) -> None:
    env, pool = prepared(env)
    made = []
    for _ in range(7):
        code, out, err = cli(env, "reserve", "--pool", pool, "--gpus", "1", "--for", "1h")
        assert code == 0, err
        made.append(json.loads(out)["id"])
    code, out, err = cli(env, "reservations", "list", "--query", "[].id")
    assert code == 0, err
    assert json.loads(out) == made[::-1]  # newest first: [0] is the one made last
