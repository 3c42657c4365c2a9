"""A call that finds no free store connection answers `unavailable` after one wait.

The library retries a failed connection attempt ten times; waiting for a pooled
connection ten times over would hold a call for most of a minute. The guard
(api/store/outage.py) answers after the first wait instead.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest

from better_compute.api.store.store import POOL_WAIT
from better_compute.domain.errors import Unavailable


def test_an_exhausted_pool_answers_unavailable_after_one_wait(runtime: Any) -> None:
    store = runtime.store
    datastore = store.recorder.datastore
    pool_size = 15  # 5 + 10 overflow, on both backends
    kwargs = {"commit": False} if store.backend == "sqlite" else {}
    with contextlib.ExitStack() as held:
        for _ in range(pool_size):
            held.enter_context(datastore.get_connection(**kwargs))
        started = time.monotonic()
        with pytest.raises(Unavailable, match="came free in time"):
            store.recorder.max_notification_id()
        took = time.monotonic() - started
    assert took < 2 * POOL_WAIT, took
    assert store.recorder.max_notification_id() is not None  # free again: it answers
