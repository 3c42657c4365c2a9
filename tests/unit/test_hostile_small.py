"""Smaller hostile-input holes, checked without a store.

- a bad BETTER_COMPUTE_DATABASE_URL is never echoed with its password;
- ids, idempotency keys and tenant ids refuse a trailing newline (``$`` matches before a
  final newline: every anchored pattern of the code base ends in ``\\Z``);
- names refuse NUL and the bidi overrides; durations, starts and quotas have upper bounds.
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from better_compute.api.store.store import StoreConfig
from better_compute.domain.durations import parse_duration, parse_start
from better_compute.domain.errors import BetterComputeError, InvalidInput
from better_compute.domain.ids import check_key, check_tenant_id
from better_compute.domain.pool import parse_quota
from better_compute.domain.text import check_name

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize("url", [
    f"mysql://admin:{SECRET}@db.example.com/compute",
    f"postgres://admin:{SECRET}@db.example.com:notaport/compute",
    f"postgres://admin:{SECRET}@db.example.com:99999/compute",
    f"postgresql://admin:{SECRET}@[::1/compute",
])
def test_a_bad_database_url_is_never_echoed_with_its_password(url: str) -> None:
    with pytest.raises(BetterComputeError) as err:
        StoreConfig.from_env({"BETTER_COMPUTE_DATABASE_URL": url})
    assert SECRET not in str(err.value), str(err.value)
    assert "BETTER_COMPUTE_DATABASE_URL" in str(err.value)


@pytest.mark.parametrize("url", [
    f"postgresql://admin:{SECRET}@/compute",  # libpq: the default unix socket
    f"postgresql://:{SECRET}@db.example.com/compute",  # libpq: PGUSER, else the login name
    f"postgresql://admin:{SECRET}@db.example.com",  # libpq: the database named as the user
])
def test_a_url_libpq_completes_is_taken_and_never_shows_its_password(url: str) -> None:
    config = StoreConfig.from_env({"BETTER_COMPUTE_DATABASE_URL": url})
    assert config.backend == "postgres"
    assert SECRET not in repr(config) and SECRET not in config.describe(), config.describe()


def test_the_store_config_never_shows_the_password() -> None:
    config = StoreConfig.from_env(
        {"BETTER_COMPUTE_DATABASE_URL": f"postgresql://admin:{SECRET}@db.example.com/compute"})
    assert SECRET not in repr(config)
    assert SECRET not in config.describe()


@pytest.mark.parametrize("check,value", [
    (check_key, "site-eu-1\n"), (check_tenant_id, "acme\n"), (check_key, "k\x00"),
    (check_tenant_id, "acme\r\n"),
])
def test_ids_and_keys_refuse_a_trailing_newline(check: object, value: str) -> None:
    with pytest.raises(InvalidInput):
        check(value)  # type: ignore[operator]


def _anchored_patterns() -> list[tuple[str, str]]:
    found = []
    for folder in ("domain", "api", "cli", "agent", "projections"):
        for source in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                        "compile", "match", "fullmatch", "search")
                        and node.args and isinstance(node.args[0], ast.Constant)
                        and isinstance(node.args[0].value, str)):
                    found.append((f"{source.relative_to(ROOT)}:{node.lineno}",
                                  node.args[0].value))
    return found


def test_no_pattern_ends_in_a_dollar_that_lets_a_newline_through() -> None:
    patterns = _anchored_patterns()
    assert len(patterns) > 20  # the scan sees the code base
    loose = [(where, p) for where, p in patterns
             if p.startswith("^") and p.endswith("$") and not p.endswith("\\$")]
    assert not loose, f"anchor these with \\Z (or use fullmatch): {loose}"
    for _, pattern in patterns:
        if pattern.startswith("^") and pattern.endswith("\\Z"):
            assert re.compile(pattern)  # still a valid pattern


@pytest.mark.parametrize("name", ["a\x00b", "evil\u202etxt", "\u2066x\u2069", "two\nlines",
                                  "zero\u200bwidth", "x" * 201, "\ud800"])
def test_names_refuse_hidden_characters_and_length(name: str) -> None:
    with pytest.raises(InvalidInput):
        check_name(name)


@pytest.mark.parametrize("name", ["Acme Corp", "Zürich GPU hall 2", "東京", "ops/team-1 (prod)",
                                  "x" * 200, ""])
def test_ordinary_names_pass(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize("text", ["999999999999d", "3651d", "1" * 5000 + "s", "99999999999999s"])
def test_durations_have_an_upper_bound(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_duration(text)


@pytest.mark.parametrize("text", ["+3000000d", "9999-12-31T00:00:00Z", "+3651d"])
def test_starts_have_an_upper_bound(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_start(text, datetime(2026, 1, 1, tzinfo=UTC))


@pytest.mark.parametrize("value", [10**30, 2**63, 1_000_001, -1])
def test_quotas_have_bounds(value: int) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_quota({"gpu": value})
    assert len(err.value.message) < 300


def test_the_largest_quota_passes() -> None:
    assert parse_quota({"gpu": 1_000_000}) == {"gpu": 1_000_000}
