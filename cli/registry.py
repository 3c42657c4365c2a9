"""Command groups register their verbs here; main.py builds the parser from it.

Every verb and group carries examples (shown at the end of its help, the tutorial's own
commands where it has them). The output flags are global: ``-o``/``--output`` and
``-q``/``--query`` are accepted before the command as well as after it (their default is
"not given", so a verb's parser never overwrites what the top level parsed).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from better_compute.cli.context import Context

Runner = Callable[[Context, argparse.Namespace], int | None]
FORMATS = ("table", "wide", "json", "yaml", "name")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """--output and --query, for every command that prints an object (and the top level)."""
    parser.add_argument("--output", "-o", choices=FORMATS, default=argparse.SUPPRESS,
                        help="table (default on a terminal), wide, json (default when piped), "
                        "yaml, or name (ids only, one a line)")
    parser.add_argument("--query", "-q", metavar="JMESPATH", default=argparse.SUPPRESS,
                        help="print only this part of the answer; a scalar prints bare")


def add_all_tenants(parser: argparse.ArgumentParser, what: str) -> None:
    """-A/--all-tenants, kubectl's spelling, on a list command: every tenant's objects
    (root-tenant tokens only), with a TENANT column in tables."""
    parser.add_argument("--all-tenants", "-A", action="store_true",
                        help=f"every tenant's {what}, with a TENANT column (root-tenant tokens "
                        "only)")


def epilog(examples: Sequence[str]) -> str | None:
    if not examples:
        return None
    return "examples:\n" + "".join(f"  {e}\n" for e in examples)


def add_verb(group: Any, name: str, run: Runner, help_text: str, *,
             output: bool = True, examples: Sequence[str] = (),
             **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, epilog=epilog(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs
    )
    if output:
        add_output_flags(parser)
    parser.set_defaults(run=run)
    return parser


def add_group(sub: Any, name: str, help_text: str, *, examples: Sequence[str] = ()) -> Any:
    parser = sub.add_parser(name, help=help_text, description=help_text,
                            epilog=epilog(examples),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_output_flags(parser)  # global: `nodes -o json list` works too
    parser.set_defaults(run=None, group_parser=parser)
    return parser.add_subparsers(title="commands", metavar="COMMAND")
