"""docs/api.md and docs/cli.md stay in step with the code.

- every registered JSON-RPC method has a section headed `### \\`name\\`` in docs/api.md that
  names each of its params in backticks, and every stable error code appears there;
- every CLI command (walking the argparse tree of cli/main.py) has a section headed
  `### \\`better-compute <command>\\`` in docs/cli.md that names each of its flags;
- every BETTER_COMPUTE_* variable the CLI or the API reads is documented somewhere in docs/.

Adding a method, a param, a command or a flag? Document it, and this test passes again.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from better_compute.api.http import rpc
from better_compute.api.http.methods import Method
from better_compute.cli.main import build_parser
from better_compute.domain.errors import error_codes

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Protocol-level codes rpc.py answers with besides the error classes'.
PROTOCOL_CODES = {"invalid_request", "method_not_found", "internal"}
COMMON_FLAGS = {"--help", "--output", "--query"}  # documented once, under "Output"

# Methods and commands of issues still being built beside the foundation, whose reference
# sections have not been written yet. Each entry is NOT checked: remove it with its docs.
PENDING_METHODS: set[str] = set()
PENDING_COMMANDS: set[str] = set()
PENDING_VARIABLES: set[str] = set()


def sections(text: str) -> dict[str, str]:
    """Heading text in backticks -> the text up to the next heading."""
    out: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines():
        heading = re.match(r"^#{2,4} `([^`]+)`\s*$", line)
        if heading:
            current = heading.group(1)
            out[current] = ""
        elif line.startswith("#"):
            current = None
        elif current is not None:
            out[current] += line + "\n"
    return out


def command_parsers(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
                    ) -> dict[str, argparse.ArgumentParser]:
    """Every leaf command (one without sub-commands) by its path, such as 'pools create'."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                path = (*prefix, name)
                nested = command_parsers(child, path)
                found.update(nested or {" ".join(path): child})
    return found


def param_names(method: Method) -> list[str]:
    schema = method.schema()
    ref = schema.get("$ref", "").rsplit("/", 1)[-1]
    body = schema.get("$defs", {}).get(ref, schema)
    return list(body.get("properties", {}))


API = sections((DOCS / "api.md").read_text())
CLI = sections((DOCS / "cli.md").read_text())
COMMANDS = command_parsers(build_parser())


@pytest.mark.parametrize("name", sorted(set(rpc.METHODS) - PENDING_METHODS))
def test_every_method_is_in_the_api_reference(name: str) -> None:
    assert name in API, f"docs/api.md has no section `### \\`{name}\\``: document the method"
    for param in param_names(rpc.METHODS[name]):
        assert f"`{param}`" in API[name], (
            f"docs/api.md, section {name}: param `{param}` is not described")


def test_every_error_code_is_in_the_api_reference() -> None:
    text = (DOCS / "api.md").read_text()
    codes = error_codes() | PROTOCOL_CODES
    missing = sorted(c for c in codes if f"`{c}`" not in text)
    assert not missing, f"error codes missing from docs/api.md's table: {missing}"


@pytest.mark.parametrize("path", sorted(set(COMMANDS) - PENDING_COMMANDS))
def test_every_command_is_in_the_cli_reference(path: str) -> None:
    heading = f"better-compute {path}"
    assert heading in CLI, f"docs/cli.md has no section `### \\`{heading}\\``: document it"
    for action in COMMANDS[path]._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag not in COMMON_FLAGS:
                assert re.search(rf"`{re.escape(flag)}(?![\w-])", CLI[heading]), (
                    f"docs/cli.md, section {heading}: flag `{flag}` is not described")


def test_pending_entries_are_still_real() -> None:
    """Entries disappear from the pending sets once they are documented (or removed)."""
    assert not PENDING_METHODS - set(rpc.METHODS), PENDING_METHODS - set(rpc.METHODS)
    assert not PENDING_COMMANDS - set(COMMANDS), PENDING_COMMANDS - set(COMMANDS)
    documented = {m for m in PENDING_METHODS if m in API}
    documented |= {c for c in PENDING_COMMANDS if f"better-compute {c}" in CLI}
    assert not documented, f"documented now, remove from the pending sets: {sorted(documented)}"


def test_every_environment_variable_is_documented() -> None:
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    used: set[str] = set()
    for folder in ("cli", "api"):
        for source in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"\bBETTER_COMPUTE_[A-Z_]*[A-Z]\b", source.read_text()))
    missing = sorted(v for v in used - PENDING_VARIABLES if v not in docs)
    stale = sorted(v for v in PENDING_VARIABLES if v in docs or v not in used)
    assert not stale, f"remove from PENDING_VARIABLES (documented, or no longer read): {stale}"
    assert not missing, f"environment variables read by the code but not in docs/: {missing}"


def test_the_gpu_models_table_is_the_codes() -> None:
    """docs/gpu-models.md lists exactly domain/gpu_models.py's MODELS, in order."""
    from better_compute.domain.gpu_models import MODELS

    text = (DOCS / "gpu-models.md").read_text()
    table = text.split("<!-- gpu-models:", 1)[1].split("<!-- /gpu-models -->", 1)[0]
    rows = [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in table.splitlines()[3:] if line.startswith("|")]

    def names(cell: str) -> list[str]:
        return re.findall(r"`([^`]+)`", cell)

    documented = [(names(r[0])[0], r[1], r[2], names(r[3]), names(r[4])) for r in rows]
    assert documented == [(m.name, m.vendor, m.architecture, list(m.reports), list(m.aliases))
                          for m in MODELS]
