"""Imports point inward (docs/architecture.md, "Where things live"), checked on the source's AST.

- domain/ does no I/O and imports nothing of ours but domain/;
- projections/ import only domain/ (and themselves);
- agent/ imports only api/wire/ (and itself): the single-file bcd ships exactly those;
- api/ never imports cli/ or agent/; api/wire/ imports nothing of ours but itself, the one
  table of GPU models (domain/gpu_models.py) and the one rule for text shown to people
  (domain/visible.py), which import the standard library only, so bcd ships them beside the
  wire schemas (scripts/build-bcd);
- cli/ reaches the server only through its client (cli/client.py), except the commands that
  ARE the server's local tools and say so below;
- no import cycles among our modules, counting imports inside functions (a deferred import
  hides a cycle, it does not remove it) but not those under ``if TYPE_CHECKING:``, which never
  run: they name a type for the checker, as a quoted annotation would.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
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


def sources(folder: str, root: Path = ROOT) -> Iterator[Path]:
    for path in sorted((root / folder).rglob("*.py")):
        if "__pycache__" not in path.parts and not path.name.startswith("api_pb2"):
            yield path


def imports(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``, relative ones resolved."""
    package = ".".join([PACKAGE, *path.relative_to(root).with_suffix("").parts[:-1]])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from ((node.lineno, module) for module in imported(node, package))


def imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The modules an import statement in ``package`` names: for ``from X import a, b``, X
    and, when X is ours, X.a and X.b (either may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        parent = ".".join(parts[:len(parts) - node.level + 1])
        base = f"{parent}.{base}" if base else parent
    # `from better_compute.api import pki` names a module
    return [base, *(f"{base}.{alias.name}" for alias in node.names
                    if base.startswith(PACKAGE) and alias.name != "*")]


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


LAYERS = ("domain", "projections", "api", "cli", "agent")


def module_of(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join([PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def run_imports(path: Path, modules: set[str], root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module of ``modules``) of every import in ``path`` that runs: wherever it is,
    unless under ``if TYPE_CHECKING:``. ``from pkg import name`` is an import of pkg.name when
    that is a module, else of pkg; importing a module runs its packages first, except the
    importer's own, which are already running."""
    tree = ast.parse(path.read_text(), str(path))
    checking = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
                for stmt in node.body for n in ast.walk(stmt)}
    importer = module_of(path, root)
    running = {importer.rsplit(".", i)[0] for i in range(importer.count(".") + 1)}
    package = importer if path.name == "__init__.py" else importer.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in checking:
            continue
        named = imported(node, package)
        if isinstance(node, ast.ImportFrom):  # pkg.name where a module, else pkg
            named = [m for m in named[1:] if m in modules] or named[:1]
        for module in named:
            packages = [module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)]
            for name in [module, *packages]:
                if name in modules and name not in running:
                    yield node.lineno, name


def import_graph(root: Path = ROOT, layers: tuple[str, ...] = LAYERS) -> dict[str, dict[str, str]]:
    """module -> {module it imports: where, as path:line}."""
    paths = [path for layer in layers for path in sources(layer, root)]
    modules = {module_of(p, root) for p in paths}
    graph: dict[str, dict[str, str]] = {}
    for path in paths:
        edges = graph.setdefault(module_of(path, root), {})
        for line, module in run_imports(path, modules, root):
            edges.setdefault(module, f"{path.relative_to(root)}:{line}")
    return graph


def a_cycle(graph: dict[str, dict[str, str]]) -> list[str]:
    """One import cycle, as the imports that make it (path:line: module), or []."""
    try:
        graphlib.TopologicalSorter({m: set(edges) for m, edges in graph.items()}).prepare()
    except graphlib.CycleError as exc:
        cycle = exc.args[1]  # [a, ..., a], each imported by the next
        return [f"{graph[b][a]}: {a}" for a, b in itertools.pairwise(cycle)]
    return []


def test_no_import_cycles() -> None:
    cycle = a_cycle(import_graph())
    assert cycle == [], "an import cycle, each line importing the next:\n" + "\n".join(cycle)


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    """A cycle closed inside a function is found; one closed only under TYPE_CHECKING is not,
    nor is a package's import of its own modules."""
    api = tmp_path / "api"
    api.mkdir()
    (api / "__init__.py").write_text("from . import a\n")
    (api / "a.py").write_text("from typing import TYPE_CHECKING\nfrom better_compute.api import b\n"
                              "if TYPE_CHECKING:\n    from better_compute.api.d import D\n")
    (api / "b.py").write_text("import better_compute.api.c\n")
    (api / "c.py").write_text("def f():\n    from better_compute.api.a import x\n")
    (api / "d.py").write_text("from better_compute.api.a import y\n")
    assert set(a_cycle(import_graph(tmp_path, ("api",)))) == {
        "api/a.py:2: better_compute.api.b", "api/b.py:1: better_compute.api.c",
        "api/c.py:2: better_compute.api.a"}
    (api / "c.py").write_text("x = 1\n")
    assert a_cycle(import_graph(tmp_path, ("api",))) == []
