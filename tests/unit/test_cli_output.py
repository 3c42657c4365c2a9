"""One renderer: --query (JMESPath) first, then bare scalars, JSON or a table."""

from __future__ import annotations

import io
import json

import pytest

from better_compute.cli.output import apply_query, emit
from better_compute.domain.errors import InvalidInput

SITE = {"id": "site_abc", "kind": "shared", "region": "eu-1", "offerings": [{"gpu": 16}]}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def render(value: object, **options: str | None) -> str:
    out = io.StringIO()
    emit(value, out=out, **options)  # type: ignore[arg-type]
    return out.getvalue()


def test_a_scalar_query_prints_bare_for_shell_capture() -> None:
    assert render(SITE, query="id") == "site_abc\n"
    assert render({"n": 16}, query="n") == "16\n"
    out = Tty()
    emit(SITE, query="id", out=out)  # bare on a terminal too
    assert out.getvalue() == "site_abc\n"


def test_non_scalar_answers_are_json_when_piped() -> None:
    assert json.loads(render(SITE)) == SITE
    assert json.loads(render(SITE, query="offerings")) == [{"gpu": 16}]
    assert render({"ok": True}, query="ok") == "true\n"  # booleans stay JSON
    assert render(SITE, query="missing") == "null\n"


def test_tables_on_a_terminal_and_json_when_asked() -> None:
    out = Tty()
    emit([SITE, {**SITE, "id": "site_def"}], out=out)
    table = out.getvalue()
    assert "site_abc" in table and "site_def" in table and "REGION" in table
    assert not table.lstrip().startswith("[")
    out = Tty()
    emit(SITE, out=out, output="json")
    assert json.loads(out.getvalue()) == SITE


def test_table_forced_when_piped() -> None:
    text = render(SITE, output="table")
    assert "site_abc" in text and not text.lstrip().startswith("{")
    assert "No resources found." in render([], output="table")


def test_a_bad_query_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="is not a JMESPath expression"):
        apply_query(SITE, "[0")
    assert apply_query(SITE, None) is SITE
