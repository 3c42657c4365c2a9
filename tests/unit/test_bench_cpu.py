"""The benchmarks' CPU reading counts a server's worker processes too.

``serve --workers N`` forks its workers (api/http/workers.py): a reading of the parent
alone said a call cost 0.003 ms of CPU (benchmarks/rpc_path.py, 2026-12-02).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from better_compute.benchmarks.harness import cpu_seconds, cpu_ticks, steal_percent

_BUSY_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass\\n"
    "print('done', flush=True)\\ntime.sleep(60)"], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


def test_cpu_seconds_counts_live_descendants() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _BUSY_CHILD], stdout=subprocess.PIPE,
                              text=True, start_new_session=True)  # a group: the child too
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "done"  # the child spun 0.6 s of CPU
        # The parent itself spends well under 0.5 s (an interpreter's start-up).
        assert cpu_seconds(parent.pid) >= 0.5
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # not only the parent: its child sleeps 60 s
        parent.wait()


def test_cpu_seconds_of_no_process_is_zero() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    assert cpu_seconds(process.pid) == 0.0


def test_steal_is_the_share_of_the_machine_time_between_two_readings() -> None:
    assert steal_percent((10, 1000), (35, 1100)) == 25.0
    assert steal_percent((10, 1000), (10, 1000)) == 0.0  # no time passed: nothing stolen
    steal, total = cpu_ticks()
    assert 0 <= steal <= total and total > 0  # this Linux machine has /proc/stat
