"""tests/support.wait_for_line: lines that arrive together are each found.

A process often prints two lines in one go (bcd: ``kubelet: registered …`` and ``session
connected …``). Reading through the pipe's buffered file object took both into Python's
buffer while ``select`` looked only at the pipe, so the second line was never seen: the
kubernetes end-to-end test's restarted bcd seemed silent for 60 s.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support import wait_for_line

# Two lines in one write, then (once told to go on) a third line and an exit.
CHILD = ("import sys, time\n"
         "sys.stdout.write('first\\nsecond\\n'); sys.stdout.flush()\n"
         "sys.stdin.readline()\n"
         "print('third', flush=True)\n")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def test_a_line_written_together_with_the_one_before_is_found(
        child: subprocess.Popen[str]) -> None:
    assert wait_for_line(child, "first", timeout=10) == "first\n"
    assert wait_for_line(child, "second", timeout=10) == "second\n"


def test_what_follows_the_line_found_is_left_for_the_next_reader(
        child: subprocess.Popen[str]) -> None:
    assert wait_for_line(child, "first", timeout=10) == "first\n"
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    assert child.stdout.read() == "second\nthird\n"


def test_a_missing_line_fails_with_what_was_printed() -> None:
    """The child prints its lines and exits: the wait ends at the end of its output, however
    slowly a loaded machine starts it (no timeout is part of what is checked)."""
    process = subprocess.Popen([sys.executable, "-c", "print('first'); print('second')"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(AssertionError,
                           match=r"no line with 'fourth'.*'first\\n', 'second\\n'"):
            wait_for_line(process, "fourth", timeout=600)
    finally:
        process.kill()
        process.wait(timeout=10)
