"""Imports point inward (docs/architecture.md, "Where things live"), checked on the source's AST.

- domain/ does no I/O and imports nothing of ours but domain/;
- projections/ import only domain/ (and themselves);
- agent/ imports only api/wire/ (and itself): the single-file bcd ships exactly those;
- api/ never imports cli/ or agent/; api/wire/ imports nothing of ours but itself, the one
  table of GPU models (domain/gpu_models.py) and the one rule for text shown to people
  (domain/visible.py), which import the standard library only, so bcd ships them beside the
  wire schemas (scripts/build-bcd);
- cli/ reaches the server only through its client (cli/client.py), except the commands that
  ARE the server's local tools and say so below.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "better_compute"

# Modules whose import means I/O (or a clock-free domain would not need them).
IO_MODULES = {"os", "io", "socket", "ssl", "sqlite3", "subprocess", "shutil", "pathlib",
              "tempfile", "threading", "asyncio", "anyio", "httpx", "psycopg", "requests",
              "urllib", "http", "logging", "time", "random", "secrets", "starlette", "uvicorn",
              "grpc", "eventsourcing.persistence", "eventsourcing.application",
              "eventsourcing.postgres", "eventsourcing.sqlite"}

# cli/ modules that run the server's own code in this process, and why.
CLI_SERVER_SIDE = {
    "cli/client.py": "the client: over HTTPS, or the in-process Runtime (no server running)",
    "cli/commands/setup.py": "init writes the store and the PKI; serve IS the server",
    "cli/commands/store.py": "store backup|restore|verify work on the store's files",
    "cli/commands/events.py": "events watch with no server follows the local store",
}
CLI_ANYWHERE = ("better_compute.api.net", "better_compute.api.wire", "better_compute.domain",
                "better_compute.cli")


def sources(folder: str) -> Iterator[Path]:
    for path in sorted((ROOT / folder).rglob("*.py")):
        if "__pycache__" not in path.parts and not path.name.startswith("api_pb2"):
            yield path


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    package = ".".join([PACKAGE, *path.relative_to(root).with_suffix("").parts[:-1]])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[:len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            yield node.lineno, base
            for alias in node.names:  # `from better_compute.api import pki` names a module
                if base.startswith(PACKAGE) and alias.name != "*":
                    yield node.lineno, f"{base}.{alias.name}"


def ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def within(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def violations(folder: str, allowed: tuple[str, ...]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line}: {module}"
            for path in sources(folder) for line, module in imports(path)
            if ours(module) and not within(module, *allowed)
            and module not in (PACKAGE, f"{PACKAGE}.api")]


def test_domain_imports_only_the_domain() -> None:
    assert violations("domain", (f"{PACKAGE}.domain",)) == []


def test_domain_does_no_io() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}: {module}"
             for path in sources("domain") for line, module in imports(path)
             if any(within(module, io) for io in IO_MODULES)]
    assert found == []


def test_projections_import_only_the_domain() -> None:
    assert violations("projections", (f"{PACKAGE}.domain", f"{PACKAGE}.projections")) == []


def test_agent_imports_only_the_wire_schemas() -> None:
    assert violations("agent", (f"{PACKAGE}.agent", f"{PACKAGE}.api.wire")) == []


# The domain's modules that api/wire/ (and so bcd) may import: each imports the standard
# library only, and scripts/build-bcd copies it into the single-file bcd.
WIRE_FROM_DOMAIN = (f"{PACKAGE}.domain.gpu_models", f"{PACKAGE}.domain.visible")


def test_wire_schemas_import_nothing_else_of_ours() -> None:
    assert violations("api/wire", (f"{PACKAGE}.api.wire", *WIRE_FROM_DOMAIN)) == []


@pytest.mark.parametrize("module", WIRE_FROM_DOMAIN)
def test_the_domain_modules_bcd_ships_import_only_the_standard_library(module: str) -> None:
    path = ROOT / Path(*module.split(".")[1:]).with_suffix(".py")
    found = {name.split(".")[0] for _, name in imports(path)} - {"__future__"}
    assert found <= set(sys.stdlib_module_names), found
    build = (ROOT / "scripts" / "build-bcd").read_text()
    assert f"cp {path.relative_to(ROOT)} " in build  # shipped in the single file


def test_api_never_imports_the_cli_or_the_agent() -> None:
    found = [v for v in violations("api", (f"{PACKAGE}.api", f"{PACKAGE}.domain",
                                           f"{PACKAGE}.projections"))]
    assert found == []


def test_cli_reaches_the_server_only_through_its_client() -> None:
    found = [v for v in violations("cli", CLI_ANYWHERE)
             if v.split(":")[0] not in CLI_SERVER_SIDE]
    assert found == []


@pytest.mark.parametrize("path", sorted(CLI_SERVER_SIDE))
def test_each_server_side_cli_module_still_needs_its_exception(path: str) -> None:
    """An exception nobody needs any more is removed from CLI_SERVER_SIDE."""
    assert any(not within(module, *CLI_ANYWHERE)
               for _, module in imports(ROOT / path) if ours(module))


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The checker itself: I/O and an outward import, relative or absolute, are caught."""
    bad = tmp_path / "domain" / "bad.py"
    bad.parent.mkdir()
    bad.write_text("import sqlite3\nfrom ..api.store import store\n"
                   "from better_compute.api import runtime\nfrom . import errors\n")
    found = list(imports(bad, tmp_path))
    assert found == [(1, "sqlite3"), (2, f"{PACKAGE}.api.store"),
                     (2, f"{PACKAGE}.api.store.store"), (3, f"{PACKAGE}.api"),
                     (3, f"{PACKAGE}.api.runtime"), (4, f"{PACKAGE}.domain"),
                     (4, f"{PACKAGE}.domain.errors")]
    outward = [m for _, m in found if ours(m) and not within(m, f"{PACKAGE}.domain")]
    assert f"{PACKAGE}.api.store.store" in outward and f"{PACKAGE}.api.runtime" in outward
