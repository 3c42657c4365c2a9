"""Every store-backed test runs on SQLite and on PostgreSQL.

scripts/test starts a throwaway PostgreSQL cluster and sets BC_TEST_PG_URL.
Without it, PostgreSQL tests FAIL with the fix (they never skip silently),
unless BC_TEST_BACKENDS=sqlite explicitly narrows a quick local run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from better_compute.api.store import aggregate_cache
from tests.ordering import pytest_collection_modifyitems  # noqa: F401  (the run's order)
from tests.support import drop_schema, open_runtime, quick_init, store_env

# Every in-process test fails when code changes a cached copy-on-write aggregate's values in
# place (api/store/aggregate_cache.py): their copies share those values.
aggregate_cache.CHECK_IN_PLACE = True

BACKENDS = [b for b in os.environ.get("BC_TEST_BACKENDS", "sqlite,postgres").split(",") if b]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(backend: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a fresh, empty store on ``backend``."""
    e = store_env(backend, tmp_path)
    yield e
    drop_schema(e)


@pytest.fixture(scope="module", params=BACKENDS)
def shared_env(request: pytest.FixtureRequest,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Like ``env``, one store on each backend shared by a module's tests: only for tests
    that leave it as they found it (refusals that assert the event log did not move, reads),
    so that none depends on another or on the order they run in."""
    e = store_env(str(request.param), tmp_path_factory.mktemp("shared"))
    yield e
    drop_schema(e)


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[object]:
    """An initialized Runtime on a fresh store (root tenant, PKI)."""
    rt = open_runtime(env)
    rt.root_token = quick_init(rt)  # type: ignore[attr-defined]
    yield rt
    rt.close()


@pytest.fixture(scope="session")
def single_file_bcd(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """scripts/build-bcd's file for this Python and its SHA-256, built once per test run.

    Several tests run the shipped file; building it takes half a minute, so the first to ask
    builds it and the others (in other pytest-xdist workers too) wait for it and share it.
    """
    import fcntl
    import subprocess
    import sys

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    dist, done = shared / "bcd-dist", shared / "bcd-dist.done"
    with open(shared / "bcd-dist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            python = f"{sys.version_info.major}.{sys.version_info.minor}"
            root = Path(__file__).resolve().parents[1]
            built = subprocess.run(
                [str(root / "scripts/build-bcd")], cwd=root, capture_output=True, text=True,
                timeout=600, env={**os.environ, "PYTHON": sys.executable, "BCD_PYTHONS": python,
                                  "DIST_DIR": str(dist)})
            assert built.returncode == 0, built.stderr[-3000:]
            done.write_text(built.stdout)
    path_text, digest = done.read_text().split()
    return Path(path_text), digest
