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

from tests.support import drop_schema, open_runtime, quick_init, store_env

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


@pytest.fixture
def runtime(env: dict[str, str]) -> Iterator[object]:
    """An initialized Runtime on a fresh store (root tenant, PKI)."""
    rt = open_runtime(env)
    rt.root_token = quick_init(rt)  # type: ignore[attr-defined]
    yield rt
    rt.close()
