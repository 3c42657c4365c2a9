"""The better-compute command line: small verbs, one renderer, typed errors.

Only the project's own errors become a one-line message (``error [code]: …``) and the exit
status of their class (cli/exit_codes.py); anything else is a bug and shows its traceback.
Start-up stays light: the command modules import their heavy parts (the store, httpx,
jmespath) only when a command runs, so ``--help`` and a remote call stay fast
(benchmarks/startup.py, docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any

from better_compute.cli import exit_codes
from better_compute.cli.commands import (
    api,
    capacity,
    catalog,
    completion,
    daemon,
    events,
    join_tokens,
    nodes,
    projections,
    reservations,
    setup,
    store,
    usage,
)
from better_compute.cli.registry import add_output_flags
from better_compute.domain.errors import BetterComputeError
from better_compute.domain.visible import visible

EPILOG = """\
environment:
  BETTER_COMPUTE_URL     the API (https://…; plain http only to loopback); unset: run in-process
                         on the local store
  BETTER_COMPUTE_TOKEN   a biam_… API token
  BETTER_COMPUTE_TENANT  the default --tenant of token commands
  BETTER_COMPUTE_CA_FILE a PEM bundle trusted beside the system's (init writes the serving CA's)
  BETTER_COMPUTE_DATA_DIR, BETTER_COMPUTE_DATABASE_URL  where the local store lives

-o/--output and -q/--query go anywhere on the line. Exit statuses: 0 ok, 1 error, 2 usage or
invalid input, 3 not found, 4 unauthenticated, 5 permission denied, 6 conflict, 7 quota
exceeded, 8 no capacity, 9 expired, 10 not initialized, 11 unavailable, 130 interrupted.

examples:
  better-compute help pools create
  better-compute api system.whoami
  better-compute nodes list -o wide
  source <(better-compute completion bash)"""


# The command groups, in the order `help` lists them; ``capacity`` gets reservations'
# ``--preview`` as an extension.
GROUPS = (setup, api, catalog, join_tokens, daemon, nodes,
          SimpleNamespace(register=partial(capacity.register,
                                           extensions=[reservations.CAPACITY_PREVIEW])),
          reservations, events, projections, usage, store, completion)


class _Parser(argparse.ArgumentParser):
    """No abbreviations: ``--gpu`` is not ``--gpus`` (a prefix must never become a booking)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        self.exit(exit_codes.USAGE,
                  f"error [usage]: {message}\n  (`{' '.join(['better-compute help', command]).strip()}` "
                  "shows the command's flags)\n")


class _Version(argparse.Action):
    """--version, read from the installed distribution only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("better-compute")
        except PackageNotFoundError:
            text = "unknown"
        print(f"better-compute {text}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="better-compute", description="A control plane for GPU clusters.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    add_output_flags(parser)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)
    help_parser = sub.add_parser(
        "help", help="List the commands, or show one: help COMMAND [VERB]",
        description="List the commands, or show one: help COMMAND [VERB]",
        epilog="examples:\n  better-compute help\n  better-compute help pools create\n",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    help_parser.add_argument("topic", nargs="*")
    help_parser.set_defaults(run="help")
    for group in GROUPS:
        group.register(sub)
    parser.set_defaults(root_parser=parser)  # `completion` walks the whole tree
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
        print(f"error [usage]: no command {' '.join(topic)!r}; `better-compute help` lists them",
              file=sys.stderr)
        return exit_codes.USAGE
    target.print_help()
    return 0


def _command_words(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    words: list[str] = []
    for word in argv:
        if word.startswith("-") or _find(parser, [*words, word]) is None:
            continue
        words.append(word)
    return words


def _command_parser(parser: argparse.ArgumentParser, argv: Sequence[str]
                    ) -> argparse.ArgumentParser:
    """The parser of the command ``argv`` names (its leading words), for error messages."""
    return _find(parser, _command_words(parser, argv)) or parser


def _unknown_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first ``--flag`` on the line that neither the command nor the groups above it
    take, with a "did you mean" when one of the command's flags is close. Checked before
    parsing, so a typo is named as such (not as a required flag missing) and nothing runs."""
    import difflib

    words = _command_words(parser, argv)
    known: dict[str, argparse.Action] = {}
    for depth in range(len(words) + 1):
        level = _find(parser, words[:depth])
        if level is not None:
            known.update(level._option_string_actions)
    takes_value = False
    for at, token in enumerate(argv):
        if takes_value:
            takes_value = False
            continue
        if token == "--":
            return None
        name = token.split("=", 1)[0]
        action = known.get(name)
        if action is not None:
            takes_value = action.nargs != 0 and "=" not in token
        elif token.startswith("--"):
            close = difflib.get_close_matches(name, [o for o in known if o.startswith("--")],
                                              n=1, cutoff=0.6)
            value = argv[at + 1:at + 2] if "=" not in token else []
            shown = " ".join([token, *(v for v in value if not v.startswith("-"))])
            return shown + (f" (did you mean {close[0]}?)" if close else "")
    return None


def report(exc: BetterComputeError) -> int:
    """``error [code]: message`` on standard error; the exit status of the error's class."""
    message = visible(str(exc), keep="\n")
    print(f"error [{exc.code}]: {message}", file=sys.stderr)
    return exit_codes.for_code(exc.code)


def main(argv: Sequence[str] | None = None) -> int:
    from better_compute.cli.context import Context

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    unknown = _unknown_flag(parser, argv)
    if unknown is not None:
        _command_parser(parser, argv).error(f"unrecognized arguments: {unknown}")
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
        return 0 if target is parser else exit_codes.USAGE
    ctx = Context(env=dict(os.environ), args=args)
    try:
        code = run(ctx, args)
    except BetterComputeError as exc:
        return report(exc)
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    finally:
        ctx.close()
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
