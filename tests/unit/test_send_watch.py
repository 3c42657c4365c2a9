"""listener.SendWatch: while writing is paused, a client that takes none of its answer
for the send timeout loses the connection; one that takes some, however little, in every
window keeps it (a 1 MB answer over a slow link is read for minutes, and must not be cut
because its transport stays over the high-water mark all that time)."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.listener import SendWatch


class _Timer:
    def __init__(self, loop: _Loop, delay: float, callback: Any) -> None:
        self.loop, self.at, self.callback, self.cancelled = loop, loop.now + delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class _Loop:
    """call_later on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[_Timer] = []

    def call_later(self, delay: float, callback: Any) -> _Timer:
        timer = _Timer(self, delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        due = [t for t in self.timers if t.at <= self.now and not t.cancelled]
        self.timers = [t for t in self.timers if t not in due]
        for timer in due:
            timer.callback()


class _Transport:
    def __init__(self, held: int) -> None:
        self.held, self.aborted = held, False

    def get_write_buffer_size(self) -> int:
        return self.held

    def get_extra_info(self, name: str) -> None:
        return None  # no socket: the transport's own count alone

    def abort(self) -> None:
        self.aborted = True


def test_a_client_that_takes_nothing_is_cut_after_the_timeout() -> None:
    loop, transport = _Loop(), _Transport(held=1_000_000)
    watch = SendWatch(loop, transport, timeout=30)
    watch.paused()
    loop.advance(29)
    assert not transport.aborted
    loop.advance(1)
    assert transport.aborted


def test_a_slow_reader_that_takes_some_in_every_window_is_kept() -> None:
    loop, transport = _Loop(), _Transport(held=1_000_000)
    watch = SendWatch(loop, transport, timeout=30)
    watch.paused()
    for _ in range(20):  # ten minutes at 1 KB a window: still over the high-water mark
        transport.held -= 1024
        loop.advance(30)
        assert not transport.aborted
    loop.advance(30)  # then it stops reading
    assert transport.aborted


def test_resumed_writing_ends_the_watch_and_a_new_pause_starts_a_new_window() -> None:
    loop, transport = _Loop(), _Transport(held=100_000)
    watch = SendWatch(loop, transport, timeout=30)
    watch.paused()
    loop.advance(20)
    watch.resumed()  # drained below the low-water mark
    loop.advance(60)
    assert not transport.aborted
    watch.paused()
    watch.paused()  # paused again before resuming: one window, not two
    loop.advance(29)
    assert not transport.aborted
    loop.advance(1)
    assert transport.aborted
