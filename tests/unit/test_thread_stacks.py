"""introspect.thread_stacks: what ``kill -USR1`` writes of every thread (docs/configuration.md,
"A server that seems stuck"). It replaced faulthandler's dump of all threads, which reads
the other threads' frames while they run: in a fresh-clone CI run it printed a line number
of 439,353,344 and then the worker died of SIGSEGV."""

from __future__ import annotations

import threading

from better_compute.api.http.introspect import thread_stacks


def _waits_here(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(30)


def test_every_thread_with_its_calls_the_current_one_marked() -> None:
    started, release = threading.Event(), threading.Event()
    other = threading.Thread(target=_waits_here, args=(started, release), name="waiter")
    other.start()
    try:
        assert started.wait(10)
        text = thread_stacks()
    finally:
        release.set()
        other.join(10)
    assert f"Thread 0x{other.ident:016x} waiter (most recent call first):" in text, text
    assert "in _waits_here" in text, text
    me = threading.get_ident()
    current = text.split(f"Current thread 0x{me:016x}", 1)
    assert len(current) == 2 and "in test_every_thread_with_its_calls_the_current_one_marked" \
        in current[1].split("\nThread 0x", 1)[0], text
