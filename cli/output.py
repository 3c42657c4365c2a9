"""One renderer for every command: --query (JMESPath), then a format.

Formats (``-o``/``--output``): ``table`` (the default on a terminal: the resource's curated
columns, like kubectl's), ``wide`` (more columns), ``json`` (the default when piped), ``yaml``
and ``name`` (ids only, one a line, for shell loops). A query whose answer is a string or a
number prints bare, so ``$(… --query id)`` works. Tables never cut an id: ids are what people
copy. Imports stay light (jmespath and yaml load only when used): ``--help`` must be fast.
"""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from better_compute.cli.tables import Table, generic_table, render
from better_compute.domain.errors import InvalidInput
from better_compute.domain.visible import hidden_character, visible


def apply_query(value: Any, query: str | None) -> Any:
    if not query:
        return value
    import jmespath
    from jmespath.exceptions import JMESPathError

    try:
        return jmespath.search(query, value)
    except JMESPathError as exc:
        raise InvalidInput(f"--query {query!r} is not a JMESPath expression: {exc}") from None


def _names(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    names: list[str] = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            names.append(item["id"])
        elif isinstance(item, str):
            names.append(item)
        else:
            raise InvalidInput("-o name prints ids, and this answer has none: use -o json "
                               "or -o table")
    return names


def _yaml(value: Any) -> str:
    """YAML a person reads: a string holding a hidden character (domain/visible.py) is
    written double-quoted, where YAML reads ``\\u202e`` as the character, and every hidden
    character is written so (PyYAML keeps bidi controls as they are)."""
    import yaml

    class Dumper(yaml.SafeDumper):  # type: ignore[misc]  # yaml is untyped here
        pass

    def text(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
        style = '"' if hidden_character(data) is not None else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, text)
    return visible(str(yaml.dump(value, Dumper=Dumper, sort_keys=False,
                                 default_flow_style=False, allow_unicode=True)), keep="\n")


def emit(value: Any, *, query: str | None = None, output: str | None = None,
         out: TextIO | None = None, table: Table | None = None) -> None:
    out = out or sys.stdout
    value = apply_query(value, query)
    if query and isinstance(value, str | int | float) and not isinstance(value, bool):
        # Bare, for `$(… --query id)`: the value as it is for a program; on a terminal, a
        # person reads it: hidden characters escaped (domain/visible.py).
        print(visible(str(value)) if out.isatty() else value, file=out)
        return
    fmt = output or ("table" if out.isatty() else "json")
    if fmt in ("table", "wide"):
        # The curated columns fit the answer only when no query reshaped it.
        spec = table if table is not None and not query else None
        out.write(render(value, spec, wide=fmt == "wide") if spec else generic_table(value))
    elif fmt == "yaml":
        out.write(_yaml(value))
    elif fmt == "name":
        out.write("".join(n + "\n" for n in _names(value)))
    else:
        print(json.dumps(value, indent=2), file=out)
