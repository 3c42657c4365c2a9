"""help, help <command>, and usage errors that name the command to ask about."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Callable

import pytest

from better_compute.cli.main import build_parser, main


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
                  ) -> list[tuple[str, ...]]:
    paths: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                paths.append((*prefix, name))
                paths.extend(command_paths(child, (*prefix, name)))
    return paths


def run(argv: list[str], entry: Callable[[list[str]], int] = main) -> tuple[int, str, str]:
    """A command line's main() in this process (the CLI's, or bcd's with ``entry``)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = entry(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_help_lists_every_command_group() -> None:
    code, out, _ = run(["help"])
    assert code == 0
    top = {p[0] for p in command_paths(build_parser())}
    assert {"init", "serve", "api", "pki", "tenants", "tokens", "sites", "pools"} <= top
    for name in top:
        assert f"    {name}" in out
    assert "BETTER_COMPUTE_URL" in out and "BETTER_COMPUTE_CA_FILE" in out


@pytest.mark.parametrize("path", command_paths(build_parser()), ids=" ".join)
def test_help_shows_every_command(path: tuple[str, ...]) -> None:
    code, out, _ = run(["help", *path])
    assert code == 0
    assert f"better-compute {' '.join(path)}" in out


def test_the_tutorials_flags_are_documented_in_help() -> None:
    _, out, _ = run(["help", "pools", "create"])
    for flag in ("--site", "--class", "--gpu-model", "--policy-file", "--key", "--query"):
        assert flag in out
    _, out, _ = run(["help", "pools", "offer"])
    assert "--to" in out and "--quota" in out


def test_help_of_an_unknown_command() -> None:
    code, out, err = run(["help", "pools", "delete"])
    assert code == 2 and out == ""
    assert "no command 'pools delete'" in err


def test_usage_errors_point_at_the_commands_help() -> None:
    code, _, err = run(["pools", "offer", "pool_x", "--to", "acme", "--quota", "gpu=1", "--yes"])
    assert code == 2
    assert "unrecognized arguments: --yes" in err and "`better-compute help pools offer`" in err
    code, _, err = run(["sites", "create", "--region", "eu-1"])
    assert code == 2 and "--kind" in err and "`better-compute help sites create`" in err
    code, _, err = run(["--verbose"])
    assert code == 2 and "`better-compute help`" in err


def test_a_group_without_a_verb_shows_its_commands() -> None:
    code, out, _ = run(["pools"])
    assert code == 2
    for verb in ("create", "get", "list", "offer"):
        assert verb in out
