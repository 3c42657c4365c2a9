"""Start-up: `better-compute --help` and a remote call import none of the control plane's
store or web stack, and `bcd status` none of the agent's machinery.

Each command runs in a fresh interpreter that prints the modules it imported. A command line
pays its imports on every run (benchmarks/startup.py measures the time; this keeps the
heaviest parts from creeping back in).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVER_SIDE = ("eventsourcing", "psycopg", "starlette", "uvicorn", "anyio", "jmespath",
               "better_compute.domain.aggregates", "better_compute.domain.node",
               "better_compute.api.store.store", "httpx._main", "click", "rich", "pygments")


def imported(argv: list[str], entry: str, env: dict[str, str] | None = None) -> set[str]:
    code = (f"import sys, json\nfrom {entry} import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "sys.__stdout__.write('\\nMODULES ' + json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", **(env or {})})
    return set(json.loads(done.stdout.rsplit("MODULES ", 1)[1]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


@pytest.mark.parametrize("argv", [["--help"], ["help", "pools", "create"], ["nodes", "--help"]])
def test_help_imports_no_store_web_or_http_stack(argv: list[str]) -> None:
    modules = imported(argv, "better_compute.cli.main")
    assert loaded(modules, SERVER_SIDE) == []
    assert loaded(modules, ("httpx", "ssl", "msgspec")) == []


def test_a_remote_call_imports_no_store_or_web_stack() -> None:
    # Nothing listens on port 1: the call fails after the same imports a real one makes.
    modules = imported(["api", "system.whoami"], "better_compute.cli.main",
                       {"BETTER_COMPUTE_URL": "https://127.0.0.1:1"})
    assert "http.client" in modules and "ssl" in modules  # it did get as far as the call
    assert loaded(modules, (*SERVER_SIDE, "httpx")) == []


def test_bcd_status_imports_none_of_the_agent_machinery(tmp_path: object) -> None:
    modules = imported(["status", "--json"], "better_compute.agent.main",
                       {"BCD_ROOT": str(tmp_path)})
    assert "better_compute.agent.node.status_client" in modules
    assert loaded(modules, ("anyio", "httpx", "cryptography", "msgspec", "yaml",
                            "better_compute.agent.node.agent", "importlib.metadata")) == []
