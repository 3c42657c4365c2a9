"""Command groups register their verbs here; main.py builds the parser from it."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

Runner = Callable[[Any, argparse.Namespace], int | None]


def output_options() -> argparse.ArgumentParser:
    """--output and --query, accepted by every command that prints an object."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--output", "-o", choices=["json", "table"],
                        help="json (default when piped) or table (default on a terminal)")
    common.add_argument("--query", "-q", metavar="JMESPATH",
                        help="print only this part of the answer; a scalar prints bare")
    return common


def epilog(examples: Sequence[str]) -> str | None:
    if not examples:
        return None
    return "examples:\n" + "".join(f"  {e}\n" for e in examples)


def add_verb(group: Any, name: str, run: Runner, help_text: str, *,
             output: bool = True, examples: Sequence[str] = (),
             **kwargs: Any) -> argparse.ArgumentParser:
    parents = [output_options()] if output else []
    if examples:
        kwargs.update(epilog=epilog(examples),
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    parser: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, parents=parents, **kwargs
    )
    parser.set_defaults(run=run)
    return parser


def add_group(sub: Any, name: str, help_text: str) -> Any:
    parser = sub.add_parser(name, help=help_text, description=help_text)
    parser.set_defaults(run=None, group_parser=parser)
    return parser.add_subparsers(title="commands", metavar="COMMAND")
