"""What a person who lives in kubectl and gh expects: --version, flags anywhere, completion,
examples in every help, `error [code]: …` with an exit status per error class."""

from __future__ import annotations

import argparse
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from better_compute.agent.main import main as bcd_main
from better_compute.cli import exit_codes
from better_compute.cli.commands.completion import script
from better_compute.cli.main import build_parser
from better_compute.domain import errors
from better_compute.domain.ids import public_id
from tests.unit.test_cli_help import command_paths, run

ROOT = Path(__file__).resolve().parents[2]


def test_version_on_both_programs() -> None:
    code, out, _ = run(["--version"])
    assert code == 0 and out.startswith("better-compute ") and out.split()[1][0].isdigit()
    code, out, _ = run(["--version"], bcd_main)
    assert code == 0 and out.startswith("bcd ")


@pytest.mark.parametrize("argv", [
    ["-o", "json", "--query", "id", "sites", "list"],
    ["sites", "-o", "json", "list", "--query", "id"],
    ["sites", "list", "-q", "id", "-o", "json"],
])
def test_output_flags_go_anywhere_on_the_line(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.output, args.query) == ("json", "id")


@pytest.mark.parametrize("path", command_paths(build_parser()), ids=" ".join)
def test_every_command_has_examples_in_its_help(path: tuple[str, ...]) -> None:
    code, out, _ = run(["help", *path])
    assert code == 0
    examples = out.split("examples:\n", 1)
    assert len(examples) == 2, f"`better-compute help {' '.join(path)}` has no examples"
    lines = [line for line in examples[1].splitlines() if line.startswith("  ")]
    assert lines and any("better-compute" in line or "scripts/" in line for line in lines)


def test_every_error_class_has_its_own_documented_exit_status() -> None:
    codes = {cls.code for cls in errors._all_subclasses(errors.BetterComputeError)}
    assert codes <= set(exit_codes.BY_CODE), "give the new error code an exit status"
    bad_input = {cls.code for cls in errors._all_subclasses(errors.InvalidInput)}
    for code in bad_input:  # kinds of bad input (a bad policy, ...) share its status
        assert exit_codes.for_code(code) == exit_codes.USAGE, code
    statuses = {exit_codes.for_code(c) for c in codes - bad_input}
    assert len(statuses) == len(codes - bad_input)  # every other class: its own status
    reference = (ROOT / "docs" / "cli.md").read_text()
    for code in codes:
        assert f"| {exit_codes.for_code(code)} | `{code}`" in reference or \
            f"`{code}`" in reference.split("### Exit statuses", 1)[1].split("\n## ", 1)[0], code


def test_errors_name_their_code_on_stderr_and_exit_with_its_status(tmp_path: Path) -> None:
    env = {"BETTER_COMPUTE_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    site = public_id("site", uuid.uuid4())
    done = subprocess.run([sys.executable, "-m", "better_compute.cli.main", "sites", "get", site],
                          env=env, capture_output=True, text=True, timeout=60)
    # A store `init` never ran on: every command says so (tests/integration/test_not_initialized.py).
    assert done.returncode == exit_codes.for_code("not_initialized") == 10, done.stderr
    assert done.stderr.startswith("error [not_initialized]: ") and done.stdout == ""
    code, _, err = run(["sites", "create", "--region", "eu-1"])
    assert code == exit_codes.USAGE and err.splitlines()[-2].startswith("error [usage]: ")


def test_bash_completion_completes_commands_flags_and_choices(tmp_path: Path) -> None:
    (tmp_path / "completion.bash").write_text(script("bash", build_parser()))
    probe = tmp_path / "probe.sh"
    probe.write_text(
        f"source {tmp_path / 'completion.bash'}\n"
        't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _better_compute; '
        'echo "${COMPREPLY[*]}"; }\n'
        "t better-compute no\n"
        "t better-compute -o json nodes li\n"
        't better-compute nodes list -o ""\n'
        "t better-compute reserve --po\n")
    done = subprocess.run(["bash", str(probe)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["nodes", "list", "table wide json yaml name", "--pool"]


def test_bash_completion_asks_for_ids_and_names_where_an_object_is_taken(
        tmp_path: Path) -> None:
    """On TAB after --pool, or at a command's NODE or RSV, the script runs `better-compute
    completion --names KIND` (a stand-in here, which records what it was asked)."""
    (tmp_path / "completion.bash").write_text(script("bash", build_parser()))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "better-compute"
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'asked'}\n"
                    'case "$3" in pool) printf "pool_aaa\\npool-eu-1-h100\\n" ;; '
                    'node) printf "node_bbb\\ngpu-sn-7701\\n" ;; rsv) echo rsv_ccc ;; esac\n')
    fake.chmod(0o755)
    probe = tmp_path / "probe.sh"
    probe.write_text(
        f"export PATH={bin_dir}:$PATH\nsource {tmp_path / 'completion.bash'}\n"
        't() { COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]}-1)); _better_compute; '
        'echo "${COMPREPLY[*]}"; }\n'
        "t better-compute reserve --gpus 1 --pool pool-\n"
        't better-compute nodes get ""\n'
        "t better-compute release r\n"
        "t better-compute nodes cordon gpu-sn-7701 --re\n"
        "t better-compute capacity --pool pool_a\n")
    done = subprocess.run(["bash", str(probe)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pool-eu-1-h100", "node_bbb gpu-sn-7701", "rsv_ccc",
                                        "--reason", "pool_aaa"]
    assert (tmp_path / "asked").read_text().splitlines() == [
        "completion --names pool", "completion --names node", "completion --names rsv",
        "completion --names pool"]


@pytest.mark.parametrize("shell,check", [("zsh", ["zsh", "-n"]), ("fish", ["fish", "-n"])])
def test_zsh_and_fish_scripts_parse(shell: str, check: list[str], tmp_path: Path) -> None:
    text = script(shell, build_parser())
    assert "nodes" in text and "--pool" in text.replace("-l pool", "--pool")
    path = tmp_path / f"completion.{shell}"
    path.write_text(text)
    try:
        done = subprocess.run([*check, str(path)], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return  # that shell is not installed here: the content checks above still ran
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv", [[], ["join"], ["doctor"], ["node"], ["status"]])
def test_every_bcd_command_has_examples_in_its_help(argv: list[str]) -> None:
    code, out, _ = run([*argv, "--help"], bcd_main)
    assert code == 0 and "examples:\n  " in out and "bcd " in out.split("examples:")[1]


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                found.extend(_parsers(child))
    return found


def test_no_parser_of_either_program_takes_an_abbreviated_flag() -> None:
    from better_compute.agent.main import _parser as bcd_parser

    for parser in _parsers(build_parser()) + _parsers(bcd_parser()):
        assert parser.allow_abbrev is False, parser.prog


@pytest.mark.parametrize("argv,named", [
    (["reserve", "--pool", "pool-eu-1-h100", "--gpu", "1", "--for", "1h"],
     "unrecognized arguments: --gpu 1 (did you mean --gpus?)"),
    (["reserve", "--gpu=1", "--pool", "p", "--for", "1h"],
     "unrecognized arguments: --gpu=1 (did you mean --gpus?)"),
    (["nodes", "list", "--poo", "p"], "unrecognized arguments: --poo p (did you mean --pool?)"),
    (["-o", "json", "pools", "offer", "p", "--to", "acme", "--quot", "gpu=1"],
     "unrecognized arguments: --quot gpu=1 (did you mean --quota?)"),
    (["sites", "list", "--frobnicate"], "unrecognized arguments: --frobnicate\n"),
])
def test_a_prefix_or_typo_of_a_flag_is_a_usage_error_that_names_the_flag(
        argv: list[str], named: str) -> None:
    code, out, err = run(argv)
    assert code == exit_codes.USAGE and out == ""
    assert f"error [usage]: {named}" in err


def test_a_value_that_looks_like_a_flag_is_still_a_value() -> None:
    code, _, err = run(["nodes", "cordon", "node_x", "--reason=--gpus", "--help"])
    assert code == 0, err
    code, _, err = run(["api", "system.whoami", "--", "--not-a-flag=1", "--help"])
    assert "unrecognized" not in err


def test_bcd_refuses_a_prefix_of_a_flag() -> None:
    code, _, err = run(["join", "--token", "./join-token"], bcd_main)
    assert code == 2 and "unrecognized arguments: --token" in err
