"""reserve --wait on a queued reservation: it waits for the placement, showing the position."""

from __future__ import annotations

import io
import time
from typing import Any

from better_compute.cli.commands.queue_wait import wait_while_queued


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Answers:
    """A client whose reservations.get answers come from a list, one per call."""

    tenant = "acme"

    def __init__(self, *docs: dict[str, Any]) -> None:
        self.docs = list(docs)
        self.calls = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert method == "reservations.get" and params["reservationId"] == "rsv_a"
        self.calls += 1
        return self.docs.pop(0)


def queued(position: int) -> dict[str, Any]:
    return {"id": "rsv_a", "poolId": "pool_p", "state": "queued",
            "queue": {"position": position, "deadline": "2031-05-01T18:00:00Z"}}


def test_it_waits_for_the_placement_and_shows_each_new_position() -> None:
    placed = {"id": "rsv_a", "poolId": "pool_p", "state": "placed"}
    ctx = Answers(queued(2), queued(1), queued(1), placed)
    out = Terminal()
    got = wait_while_queued(ctx, queued(3), time.monotonic() + 30, out=out, poll=0.001)
    assert got == placed and ctx.calls == 4
    shown = out.getvalue()
    assert [p for p in (3, 2, 1) if f"position {p} in pool pool_p" in shown] == [3, 2, 1]
    assert shown.count("position 1 ") == 1  # the same line is not written again
    assert shown.endswith("\n")


def test_it_stops_at_the_deadline_and_leaves_it_queued() -> None:
    ctx = Answers(*(queued(1) for _ in range(1000)))
    got = wait_while_queued(ctx, queued(1), time.monotonic() + 0.05, out=Terminal(),
                            poll=0.001)
    assert got["state"] == "queued"


def test_nothing_is_shown_off_a_terminal_and_a_placed_answer_is_returned_at_once() -> None:
    out = io.StringIO()
    placed = {"id": "rsv_a", "poolId": "pool_p", "state": "placed"}
    assert wait_while_queued(Answers(), placed, time.monotonic() + 30, out=out) == placed
    ctx = Answers({"id": "rsv_a", "poolId": "pool_p", "state": "cancelled"})
    assert wait_while_queued(ctx, queued(1), time.monotonic() + 30, out=out,
                             poll=0.001)["state"] == "cancelled"
    assert out.getvalue() == ""
