"""benchmarks/profile_split.py puts a stack where its code is, whatever the process is called.

py-spy (``--subprocesses``) starts every stack with the process's command line, and a
worker's holds its options (``"metrics_listen": null``): every stack of a worker counted as
the event loop. The save is ``ComputeStore.save`` in api/store/store.py, which py-spy writes
``save (api/store/store.py:…)``; the rule looked for ``Application.save``.
"""

from __future__ import annotations

from pathlib import Path

from better_compute.benchmarks.profile_split import part_of, split

_WORKER = ('process 7279:"/venv/bin/python -m better_compute.api.http.worker_process {"fd": 3, '
           '"options": {"metrics_listen": null, "workers": 2}}"')
_CREATE = ["_bootstrap (threading.py:1002)", "handle (api/http/rpc.py:120)",
           "reservations_create (api/http/methods/reservations.py:64)",
           "create (api/services/reservations.py:210)",
           "_book_and_save (api/services/reservations.py:299)",
           "save (api/store/store.py:215)", "_record (eventsourcing/application.py:900)"]


def test_a_creates_save_in_a_worker_is_the_save() -> None:
    assert part_of([_WORKER, *_CREATE]) == "reservations_create: the save"


def test_a_workers_command_line_is_not_the_event_loop() -> None:
    stack = [_WORKER, "thread (0x7f00)", "_bootstrap (threading.py:1002)",
             "work (api/services/somewhere.py:10)"]
    assert part_of(stack) == "other"
    assert part_of([_WORKER, "run (uvicorn/server.py:60)"]).startswith("event loop")


def test_split_sums_the_samples_by_part(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks.txt"
    stacks.write_text(f"{';'.join([_WORKER, *_CREATE])} 7\n"
                      f"{_WORKER};run (api/controllers/queue.py:55) 3\n")
    assert split(stacks) == {"reservations_create: the save": 7,
                             "controllers: queue dispatcher": 3}
