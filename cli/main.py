"""The better-compute command line: small verbs, one renderer, typed errors.

Only the project's own errors become a one-line message and a non-zero exit;
anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from better_compute.cli.commands import GROUPS
from better_compute.cli.context import Context
from better_compute.domain.errors import BetterComputeError

EPILOG = """\
environment:
  BETTER_COMPUTE_URL     the API (https://…; plain http only to loopback); unset: run in-process
                         on the local store
  BETTER_COMPUTE_TOKEN   a biam_… API token
  BETTER_COMPUTE_TENANT  the default --tenant of token commands
  BETTER_COMPUTE_CA_FILE a PEM bundle trusted beside the system's (init writes the serving CA's)
  BETTER_COMPUTE_DATA_DIR, BETTER_COMPUTE_DATABASE_URL  where the local store lives

`better-compute help COMMAND` shows one command, e.g. `better-compute help pools create`."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        self.exit(2, f"error: {message}\n  (`{' '.join(['better-compute help', command]).strip()}` "
                     "shows the command's flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="better-compute", description="A control plane for GPU clusters.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    help_parser = sub.add_parser("help", help="List the commands, or show one: help COMMAND [VERB]")
    help_parser.add_argument("topic", nargs="*")
    help_parser.set_defaults(run="help")
    for group in GROUPS:
        group.register(sub)
    return parser


def _find(parser: argparse.ArgumentParser, words: Sequence[str]) -> argparse.ArgumentParser | None:
    current = parser
    for word in words:
        actions = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not actions or word not in actions[0].choices:
            return None
        current = actions[0].choices[word]
    return current


def _help(parser: argparse.ArgumentParser, topic: Sequence[str]) -> int:
    target = _find(parser, topic)
    if target is None:
        print(f"error: no command {' '.join(topic)!r}; `better-compute help` lists them",
              file=sys.stderr)
        return 2
    target.print_help()
    return 0


def _command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]
                    ) -> argparse.ArgumentParser:
    """The parser of the command ``argv`` names (its leading words), for error messages."""
    words: list[str] = []
    for word in argv:
        if word.startswith("-") or _find(parser, [*words, word]) is None:
            break
        words.append(word)
    return _find(parser, words) or parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Reported by the command's own parser, so the hint names `help <that command>`.
        _command_parser(parser, argv).error(f"unrecognized arguments: {' '.join(extra)}")
    run = getattr(args, "run", None)
    if run == "help":
        return _help(parser, args.topic)
    if run is None:
        target = getattr(args, "group_parser", parser)
        target.print_help()
        return 0 if target is parser else 2
    ctx = Context(env=dict(os.environ), args=args)
    try:
        code = run(ctx, args)
    except BetterComputeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        ctx.close()
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
