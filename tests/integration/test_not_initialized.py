"""Every command on a store that was never initialized says ``not_initialized`` (exit 10).

Table-driven over the argparse tree: each leaf command runs in-process on an empty store with
arguments that would be valid on an initialized one, so that nothing but the missing `init`
can refuse it. A new command is covered by adding its arguments' values below (the test
fails for a required argument it has no value for). Only the commands that need no store, or
that fill an empty one, are exempt.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

import pytest

from better_compute.cli import exit_codes
from better_compute.cli.main import build_parser
from better_compute.domain.ids import public_id
from tests.support import POLICY, cli_inprocess, free_port
from tests.unit.test_docs_in_step import command_parsers

# No store at all (help, completion, the unit file), or what fills an empty store.
EXEMPT = {"help", "init", "server-unit", "completion", "store restore"}


def _values(tmp: Path) -> dict[str, str]:
    """A valid value for each argument (by its dest) a command may require."""
    policy = tmp / "pool-policy.json"
    policy.write_text(json.dumps(POLICY))
    return {
        "method": "system.whoami", "id": "acme", "role": "member", "kind": "shared",
        "region": "eu-1", "node_class": "metal-host", "gpu_model": "H100",
        "policy_file": str(policy), "to": "acme", "quota": "gpu=1", "ttl": "1h",
        "base_url": "https://compute.example.com", "bcd_version": "0.1.0",
        "sha256": "amd64=" + "0" * 64, "gpus": "1", "duration": "1h", "by": "1h",
        "from_time": "2026-01-01", "out": str(tmp / "new-file"),
        "token_id": public_id("tok", uuid.uuid4()), "site": public_id("site", uuid.uuid4()),
        "pool": public_id("pool", uuid.uuid4()), "node": public_id("node", uuid.uuid4()),
        "reservation": public_id("rsv", uuid.uuid4()),
        "join_token": public_id("jt", uuid.uuid4()),
    }


def _argv(path: str, parser: argparse.ArgumentParser, values: dict[str, str]) -> list[str]:
    argv = path.split()
    for action in parser._actions:
        wanted = action.required and action.dest != "help" and action.nargs not in ("*", "?")
        if not wanted:
            continue
        assert action.dest in values, f"`{path}`: give {action.dest} a value in _values"
        value = values[action.dest]
        argv += [action.option_strings[0], value] if action.option_strings else [value]
    return argv


COMMANDS = {p: c for p, c in command_parsers(build_parser()).items() if p not in EXEMPT}


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_on_a_store_never_initialized_says_run_init(
        path: str, env: dict[str, str], tmp_path: Path) -> None:
    argv = _argv(path, COMMANDS[path], _values(tmp_path))
    if path == "serve":  # refused before it listens: the port is never bound
        argv += ["--listen", f"127.0.0.1:{free_port()}", "--workers", "1"]
    code, out, err = cli_inprocess(argv, {**env, "BETTER_COMPUTE_TENANT": "root"})
    assert (code, out) == (exit_codes.for_code("not_initialized"), ""), (argv, err)
    assert err.startswith("error [not_initialized]: ") and "better-compute init" in err, err

