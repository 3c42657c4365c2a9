"""bcd's dependencies come from one place: pyproject.toml's `agent` group, locked with hashes.

What agent/ and api/wire/ import (statically or through ``importlib.import_module``) is exactly
the group, the lock pins every one of its requirements with a version inside its bounds and
the hashes of its wheels, and scripts/build-bcd installs the lock, not a list of its own. The
end-to-end proof is tests/e2e/test_bcd_single_file.py; this one fails without a network.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
BCD_CODE = [ROOT / "agent", ROOT / "api" / "wire", ROOT / "api" / "__init__.py",
            ROOT / "domain" / "gpu_models.py"]
LOCK = ROOT / "scripts" / "bcd.lock"
# Modules a library imports on bcd's behalf, when bcd's code uses one of its parts.
INDIRECT = {"msgspec.toml": "tomli_w"}


def agent_group() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"]["agent"]]


def imported_top_level_modules() -> set[str]:
    found: set[str] = set()
    files = [p for entry in BCD_CODE for p in ([entry] if entry.is_file() else entry.rglob("*.py"))]
    for path in files:
        source = path.read_text()
        found.update(module for use, module in INDIRECT.items() if use in source)
        tree = ast.parse(source, str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module"
                  and node.args and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and not node.args[0].value.startswith("better_compute")):
                found.add(node.args[0].value.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"__future__", "better_compute"}


def locked() -> dict[str, str]:
    return {canonicalize_name(name): version
            for name, version in re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", LOCK.read_text(), re.M)}


def test_the_agent_group_is_exactly_what_bcd_imports() -> None:
    distributions = packages_distributions()
    needed = {canonicalize_name(distributions[m][0]) for m in imported_top_level_modules()}
    group = {canonicalize_name(r.name) for r in agent_group()}
    assert needed - group == set(), "bcd imports these; add them to pyproject's agent group"
    assert group - needed == set(), "bcd imports none of these; drop them from the agent group"


def test_the_control_plane_installs_everything_bcd_needs() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    main = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert {canonicalize_name(r.name) for r in agent_group()} <= main


def test_the_lock_pins_the_group_with_hashes() -> None:
    text = LOCK.read_text()
    header = re.search(r"^# agent group: (.*)$", text, re.M)
    assert header is not None
    written = [str(Requirement(r)) for r in header.group(1).split()]  # specifiers normalised
    assert written == [str(r) for r in agent_group()], (
        "the agent group changed since scripts/bcd.lock was written: run scripts/lock-bcd")
    pins = locked()
    for requirement in agent_group():
        version = pins.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not in scripts/bcd.lock"
        assert requirement.specifier.contains(version, prereleases=True), (requirement, version)
    # Every pinned package carries at least one hash; pip's --require-hashes checks them.
    for block in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 3)[3]):
        assert "==" in block and "--hash=sha256:" in block, block


def test_the_build_installs_the_lock_and_nothing_else() -> None:
    build = (ROOT / "scripts" / "build-bcd").read_text()
    assert "--require-hashes --no-deps -r \"$lock\"" in build
    assert "lock=scripts/bcd.lock" in build and "deps=(" not in build
