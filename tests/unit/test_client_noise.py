"""http_limits.ClientNoise: a client's malformed requests cost one log line a minute."""

from __future__ import annotations

import logging

from better_compute.api import net
from better_compute.api.http import listener
from better_compute.api.http.http_limits import ClientNoise


def _record(name: str, msg: str) -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)


def test_one_line_a_window_then_how_many_were_left_out() -> None:
    now = [100.0]
    noise = ClientNoise(window=60, clock=lambda: now[0])
    first = _record("uvicorn.error", "Invalid HTTP request received.")
    assert noise.filter(first)
    assert "more within 60 s are not logged" in first.getMessage()
    passed = [noise.filter(_record("uvicorn.error", "Invalid HTTP request received."))
              for _ in range(500)]
    assert not any(passed)  # within the window: none
    now[0] += 60
    later = _record("uvicorn.error", "Invalid HTTP request received.")
    assert noise.filter(later)
    assert "500 more like it in the 60 s before were not logged" in later.getMessage()


def test_each_message_has_its_own_window_and_other_lines_pass() -> None:
    noise = ClientNoise(window=60, clock=lambda: 0.0)
    assert noise.filter(_record("uvicorn.error", "Invalid HTTP request received."))
    assert noise.filter(_record("uvicorn.error", "Unsupported upgrade request."))
    assert not noise.filter(_record("uvicorn.error", "Unsupported upgrade request."))
    for _ in range(3):  # the server's own lines, and other loggers', always pass
        assert noise.filter(_record("uvicorn.error", "Exception in ASGI application"))
        assert noise.filter(_record("better_compute.serve", "Invalid HTTP request received."))


def test_the_gateways_refused_handshakes_are_one_line_a_window() -> None:
    """The gateway's port faces every network its nodes are on: a client failing TLS
    handshakes in a loop (no certificate, or none at all in time) was a line each."""
    noise = ClientNoise(window=60, clock=lambda: 0.0)
    lines = [logging.LogRecord("better_compute.gateway", logging.WARNING, __file__, 1,
                               "gateway: TLS handshake refused: %s", (f"reason {n}",), None)
             for n in range(100)]
    passed = [line for line in lines if noise.filter(line)]
    assert len(passed) == 1 and passed[0].getMessage().startswith(
        "gateway: TLS handshake refused: reason 0 (a client's; more within 60 s"), passed


def test_the_listeners_refusals_and_failed_accepts_are_one_line_a_window() -> None:
    clock = [0.0]
    noise = ClientNoise(clock=lambda: clock[0])
    for message, args in ((net.REFUSED, ("10.0.0.1", 64, 64, "http.max_handshakes")),
                          (net.DROPPED, (1024, 1024, "http.max_handshakes")),
                          (listener.ACCEPT_FAILED, (OSError(24, "Too many open files"), 0.1))):
        records = [logging.LogRecord(net.log.name, logging.WARNING, __file__, 1,
                                     message, args, None) for _ in range(50)]
        assert [noise.filter(r) for r in records].count(True) == 1
