"""tokens.list in pages: a call answers at most ``limit`` (at most 1,000) tokens.

Revoked and expired tokens stay listed (their history), so a tenant admin who mints and
revokes in a loop grows the listing without end (live ones are bounded at 1,000:
test_token_bound.py). A call answers at most ``limit`` (default and most
``MAX_PAGE`` (domain/paging.py)) created after the token ``after``, oldest first, a shorter page being the last;
the CLI pages through. Here the page is made small (2) to show it with 5.
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
from tests.support import cli_inprocess, initialize

PAGE = 2
GHOST = public_id("tok", uuid.UUID(int=7))  # well formed, never made


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paging, "MAX_PAGE", PAGE)
    monkeypatch.setattr(context, "PAGE", PAGE)


def _made(runtime: Any, count: int) -> list[str]:
    runtime.service.tenants_create(OP, "acme", None)
    return [runtime.services.tokens.create(OP, "acme", "member", f"t{n}")["id"]
            for n in range(count)]


def test_a_call_answers_one_page_and_after_reads_on(runtime: Any, small_pages: None) -> None:
    made = _made(runtime, 5)
    tokens = runtime.services.tokens
    tokens.revoke(OP, made[1])
    assert [t["id"] for t in tokens.list(OP, "acme")] == made[:PAGE]  # the default
    pages, after = [], None
    while True:
        page = tokens.list(OP, "acme", limit=PAGE, after=after)
        pages.append([(t["id"], t["state"]) for t in page])
        if len(page) < PAGE:
            break
        after = page[-1]["id"]
    assert [[i for i, _ in p] for p in pages] == [made[:2], made[2:4], made[4:]]
    assert pages[0][1] == (made[1], "revoked")  # history is listed, in its place


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"limit": 0}, f"limit 0: ask for 1 to {PAGE}"),
    ({"limit": PAGE + 1}, f"limit {PAGE + 1}: ask for 1 to {PAGE}"),
    ({"after": GHOST}, f"after: no token {GHOST} of tenant acme"),
    ({"after": "nonsense"}, "nonsense"),
])
def test_a_bad_page_is_refused_with_the_fix(runtime: Any, small_pages: None,
                                            kwargs: dict[str, Any], says: str) -> None:
    _made(runtime, 1)
    with pytest.raises(InvalidInput) as refused:
        runtime.services.tokens.list(OP, "acme", **kwargs)
    assert says in refused.value.message


def test_the_cli_pages_through_every_token(env: dict[str, str], small_pages: None) -> None:
    initialize(env)
    env = {**env, "BETTER_COMPUTE_TENANT": "root"}
    code, out, err = cli_inprocess(["tokens", "list", "--query", "[].id"], env)
    assert code == 0, err
    before = json.loads(out)  # init's root token
    made = []
    for n in range(5):
        code, out, err = cli_inprocess(["tokens", "create", "--role", "member", "--name",
                                        f"t{n}", "-o", "json"], env)
        assert code == 0, err
        made.append(json.loads(out)["id"])
    code, out, err = cli_inprocess(["tokens", "list", "--query", "[].id"], env)
    assert code == 0, err
    assert json.loads(out) == before + made
