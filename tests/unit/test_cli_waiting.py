"""reserve --wait: until active or final, a spinner on a terminal, a note at the deadline."""

from __future__ import annotations

import contextlib
import io
from typing import Any

from better_compute.cli import exit_codes
from better_compute.cli.commands.events import printer
from better_compute.cli.waiting import settled, wait_until_settled

URL = {"BETTER_COMPUTE_URL": "https://compute.example.com"}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Server:
    """reservations.get answering the states in turn (the last one again and again)."""

    def __init__(self, *states: str, env: dict[str, str] = URL) -> None:
        self.states = list(states)
        self.env = env
        self.tenant = None
        self.gets = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert method == "reservations.get" and params["reservationId"] == "rsv_1"
        self.gets += 1
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return doc(state)


def doc(state: str, start: str = "2020-01-01T00:00:00Z") -> dict[str, Any]:
    return {"id": "rsv_1", "state": state, "nodeId": "node_1", "start": start,
            "failure": {"message": "device-missing twice"} if state == "failed" else None}


def wait(server: Server, first: dict[str, Any], seconds: float = 30) -> tuple[dict[str, Any],
                                                                             int, str]:
    err = Tty()
    with contextlib.redirect_stderr(err):
        result, code = wait_until_settled(server, first, seconds)
    return result, code, err.getvalue()


def test_it_waits_through_binding_until_active_with_a_spinner() -> None:
    server = Server("placed", "binding", "binding", "active")
    result, code, err = wait(server, doc("placed"))
    assert (result["state"], code) == ("active", exit_codes.OK)
    assert server.gets >= 3
    assert "rsv_1 is binding on node_1; waiting until it is active" in err
    assert err.endswith("\r\x1b[K")  # the spinner's line is cleared at the end


def test_a_failed_reservation_ends_with_an_error() -> None:
    result, code, err = wait(Server("binding", "failed"), doc("placed"))
    assert (result["state"], code) == ("failed", exit_codes.ERROR)
    assert "error [reservation_failed]: rsv_1 failed: device-missing twice" in err


def test_the_deadline_leaves_a_note_and_exits_zero() -> None:
    result, code, err = wait(Server("binding"), doc("placed"), seconds=0.5)
    assert (result["state"], code) == ("binding", exit_codes.OK)
    assert "rsv_1 is still binding after 0.5s (--wait)" in err


def test_no_wait_for_a_later_start_in_process_or_with_wait_0() -> None:
    later = doc("placed", start="2999-01-01T00:00:00Z")
    assert settled(later) and not settled(doc("placed")) and not settled(doc("queued"))
    assert settled(doc("released")) and settled(doc("cancelled")) and settled(doc("active"))
    for server, first, seconds in [(Server("active"), later, 30.0),
                                   (Server("active", env={}), doc("placed"), 30.0),
                                   (Server("active"), doc("placed"), 0.0)]:
        result, code, _ = wait(server, first, seconds)
        assert server.gets == 0 and result is first and code == exit_codes.OK


def test_events_print_readable_lines_on_a_terminal_json_when_piped() -> None:
    event = {"sequence": 7, "type": "reservation.active", "time": "2026-12-01T00:00:00Z",
             "subject": "rsv_1", "data": {"binding": {"nodeId": "node_1"}}}
    line = '{"sequence":7}'
    readable = printer(None, Tty(), {})(line, event)
    assert readable is not None and "#7  \x1b[32mreservation.active\x1b[0m" in readable
    assert readable.endswith("rsv_1  bound on node_1")  # green: it went well
    assert "\x1b[" not in (printer(None, Tty(), {"NO_COLOR": "1"})(line, event) or "x\x1b[")
    assert printer(None, io.StringIO(), {})(line, event) == line  # piped: JSON
    assert printer("json", Tty(), {})(line, event) == line


def test_the_signal_handlers_come_back_after_the_wait() -> None:
    """The CLI also runs in-process (tests, tools): a command must not keep its handlers."""
    import signal

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    wait(Server("binding", "active"), doc("placed"))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
