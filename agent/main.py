"""bcd, the node agent: ``bcd join | doctor | node | status``.

One composition root: main() reads BCD_ROOT and the environment, builds the
paths, and hands them to the command. Operator errors (BcdError) print one line
on standard error and exit non-zero; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import BcdError, UsageError
from .paths import Paths

_NO_POSITIONAL = (
    "bcd join takes no positional arguments: the join token is never an argument (arguments "
    "show in `ps` and shell history). Pipe it in (`bcd join ... < join-token`), set "
    "BCD_JOIN_TOKEN, or pass --token-file FILE (a file of mode 0600)"
)


class _Version(argparse.Action):
    """--version, looked up only when asked for (importlib.metadata is slow to load)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from .version import bcd_version

        print(f"bcd {bcd_version()}")
        parser.exit(0)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def _examples(*lines: str) -> str:
    return "examples:\n" + "".join(f"  {line}\n" for line in lines)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="bcd", description="The better-compute node agent. Host paths live under BCD_ROOT "
        "(default /); BCD_GPU_SOURCE=nvml|nvidia-smi|fake:FILE picks the GPU source.",
        epilog=_examples("sudo sh install-bcd.sh < join-token", "bcd doctor",
                         "bcd node --config /etc/bcd/config.toml", "sudo bcd status"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    # No abbreviations anywhere: a prefix of a flag is an unknown flag, not that flag.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_join(sub)
    _add_doctor(sub)
    _add_node(sub)
    _add_status(sub)
    return parser


def _add_join(sub: Any) -> None:
    join = sub.add_parser(
        "join", help="join this machine to a pool with a join token",
        description="Join this machine to the control plane's pool with a join token read from "
        "--token-file, BCD_JOIN_TOKEN or standard input (never an argument). Flags left out are "
        "taken from config.toml's [server], as the install script writes it. See docs/bcd.md.",
        epilog=_examples(
            "bcd join --server https://compute.example.com/api/compute --serving-ca-pin "
            "'sha256/…' --join-signing-pin 'sha256/…' --join-encryption-pin 'sha256/…' "
            "--token-file ./join-token",
            "bcd join < join-token      # the server and pins from config.toml"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    join.add_argument("--server", help="the control plane's API root, https://HOST/api/compute")
    join.add_argument("--serving-ca-pin", help="sha256/… pin of the serving CA")
    join.add_argument("--join-signing-pin", help="sha256/… pin of the join signing key")
    join.add_argument("--join-encryption-pin", help="sha256/… pin of the join encryption key")
    join.add_argument("--token-file", metavar="FILE",
                      help="the join token file (mode 0600 or 0400, yours; deleted after the join)")
    join.add_argument("positional", nargs="*", help=argparse.SUPPRESS)


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="check this machine for a join and a node",
                            description="Check privileges, config.toml, the GPU source, the "
                            "server and the clock, and say what to fix. Exits 1 when any fails.",
                            epilog=_examples(
                                "bcd doctor",
                                "bcd doctor --server https://compute.example.com/api/compute"),
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    doctor.add_argument("--server", help="the API root to check (default: config.toml's)")


def _add_node(sub: Any) -> None:
    node = sub.add_parser(
        "node", help="run the agent: the session with the gateway, desired state, status",
        description="Run the node agent: keep the session with the gateway up (reconnecting "
        "with backoff), apply the desired state, journal what it did, and serve `bcd status` "
        "on BCD_ROOT/run/bcd/bcd.sock. Stops cleanly on SIGTERM or SIGINT. See docs/bcd.md.",
        epilog=_examples("bcd node --config /etc/bcd/config.toml",
                         "systemctl enable --now bcd.service      # as the install script does"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    node.add_argument("--config", metavar="FILE",
                      help="config.toml written by bcd join (default /etc/bcd/config.toml, "
                      "under BCD_ROOT)")
    node.add_argument("--metrics-listen", metavar="[HOST:]PORT",
                      help="serve Prometheus metrics (GET /metrics: each GPU with the "
                      "allocation holding it) on PORT of 127.0.0.1, or on HOST:PORT; default "
                      "[metrics] listen of config.toml, else none. Example: --metrics-listen "
                      "9400 (docs/metrics.md)")
    node.add_argument("--log-format", choices=["text", "json"],
                      help="each output line as text (default: time, level, `bcd node:`, "
                      "message) or as one JSON object. Example: --log-format json")


def _add_status(sub: Any) -> None:
    status = sub.add_parser(
        "status", help="show the running agent: session, spec generations, sections, GPUs",
        description="Read the running bcd node over its unix socket and show its session, "
        "the applied and observed spec generations, each section and each GPU.",
        epilog=_examples("sudo bcd status", "sudo bcd status --json | jq .session"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    status.add_argument("--json", action="store_true",
                        help="print the status as JSON (schema in docs/bcd.md)")
    status.add_argument("--socket", metavar="PATH",
                        help="the agent's socket (default /run/bcd/bcd.sock, under BCD_ROOT)")


def _run(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    paths = Paths.from_env(env)
    if args.command == "join":
        if args.positional:
            raise UsageError(_NO_POSITIONAL)
        from .join import JoinOptions, join

        options = JoinOptions(args.server, args.serving_ca_pin, args.join_signing_pin,
                              args.join_encryption_pin, args.token_file)
        return join(options, paths=paths, env=env, stdin=sys.stdin)
    if args.command == "doctor":
        from .doctor import doctor

        return doctor(paths=paths, env=env, server=args.server)
    if args.command == "node":
        from .node.command import node_command

        return node_command(args.config, paths=paths, env=env, log_format=args.log_format,
                            metrics_listen=args.metrics_listen)
    if args.command == "status":
        from .node.status_client import status_command

        return status_command(paths=paths, as_json=args.json, socket=args.socket)
    raise UsageError(f"bcd {args.command} is not a bcd command")


def main(argv: Sequence[str] | None = None) -> int:
    # The commands' modules need 3.11 (tomllib); they are imported only past this check.
    if sys.version_info < (3, 11):  # noqa: UP036  (the single file runs on any python3)
        print("bcd needs Python 3.11 or newer; this is " + sys.version.split()[0], file=sys.stderr)
        return 1
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return _run(args)
    except BcdError as exc:
        print(f"bcd {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
