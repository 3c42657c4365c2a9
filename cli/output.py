"""One renderer for every command: --query (JMESPath), then JSON or a rich table.

A query whose answer is a scalar prints bare, so ``$(… --query id)`` works.
JSON when standard output is not a terminal, tables when it is, unless
``--output`` says otherwise.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

import jmespath
from jmespath.exceptions import JMESPathError

from better_compute.domain.errors import InvalidInput


def apply_query(value: Any, query: str | None) -> Any:
    if not query:
        return value
    try:
        return jmespath.search(query, value)
    except JMESPathError as exc:
        raise InvalidInput(f"--query {query!r} is not a JMESPath expression: {exc}") from None


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _table(value: Any, out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=out)
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        columns: list[str] = []
        for row in value:
            columns.extend(k for k in row if k not in columns)
        table = Table(*columns)
        for row in value:
            table.add_row(*(_cell(row.get(c)) for c in columns))
        console.print(table if value else "(none)")
    elif isinstance(value, dict):
        table = Table("field", "value", show_header=False)
        for k, v in value.items():
            table.add_row(k, _cell(v))
        console.print(table)
    else:
        console.print(_cell(value))


def emit(value: Any, *, query: str | None = None, output: str | None = None,
         out: TextIO | None = None) -> None:
    out = out or sys.stdout
    value = apply_query(value, query)
    if query and isinstance(value, str | int | float) and not isinstance(value, bool):
        print(value, file=out)
        return
    fmt = output or ("table" if out.isatty() else "json")
    if fmt == "table":
        _table(value, out)
    else:
        print(json.dumps(value, indent=2), file=out)
