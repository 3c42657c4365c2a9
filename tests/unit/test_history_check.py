"""benchmarks/history_check.py on histories written by hand: each invariant holds on a clean
one, and each is reported, with its slice of the history, when the record breaks it."""

from __future__ import annotations

from typing import Any

from better_compute.benchmarks.history_check import INVARIANTS, check

POOL = "pool_a"
T0 = "2031-05-01T12:00:00Z"


def at(seconds: float) -> str:
    whole, frac = divmod(seconds, 1)
    return f"2031-05-01T12:{int(whole) // 60:02d}:{int(whole) % 60:02d}.{int(frac * 1e6):06d}Z"


class Log:
    """A history: the setup, then calls, log events and watch lines, as the run writes them."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = [
            {"kind": "setup", "pool": POOL, "nodes": [], "quotas": {"acme": 4},
             "clients": {"c0": "acme", "c1": "root"}, "watchers": {"w-acme": "acme"}}]
        self.events: list[dict[str, Any]] = []

    def event(self, kind: str, tenant: str, subject: str, **data: Any) -> int:
        sequence = len(self.events) + 1
        self.events.append({"sequence": sequence, "type": kind, "tenantId": tenant,
                            "subject": subject, "time": T0, "data": data})
        return sequence

    def reserve(self, rsv: str, tenant: str, gpus: list[str], start: float, end: float,
                key: str, *, ack: bool = True) -> None:
        alloc = f"alloc_{rsv}"
        self.event("reservation.placed", tenant, rsv, poolId=POOL, gpuCount=len(gpus),
                   start=at(start), end=at(end), key=key, gpus=gpus, allocationId=alloc)
        self.event("bookings.booked", "root", "bookings", allocationId=alloc,
                   reservationId=rsv, gpus=gpus, start=at(start), end=at(end))
        self.records.append({"kind": "call", "client": key.split("-")[0], "tenant": tenant,
                             "method": "reservations.create",
                             "params": {"poolId": POOL, "gpus": len(gpus), "key": key},
                             "sent": 0, "done": 0, "outcome": "ack" if ack else "unknown",
                             "code": None, "result": {"id": rsv, "state": "placed",
                                                      "start": at(start)} if ack else None})

    def release(self, rsv: str, tenant: str, when: float) -> None:
        self.event("reservation.released", tenant, rsv, at=at(when), reason="released")
        self.event("bookings.ended", "root", "bookings", allocationId=f"alloc_{rsv}",
                   at=at(when))
        self.records.append({"kind": "call", "client": "c0", "tenant": tenant,
                             "method": "reservations.release",
                             "params": {"reservationId": rsv}, "sent": 0, "done": 0,
                             "outcome": "ack", "code": None,
                             "result": {"id": rsv, "state": "released",
                                        "endedAt": at(when)}})

    def finish(self, watched: list[int] | None = None, usage: dict[str, int] | None = None,
               verify_ok: bool = True) -> list[dict[str, Any]]:
        visible = [e["sequence"] for e in self.events if e["tenantId"] == "acme"]
        lines = [{"kind": "watch", "watcher": "w-acme", "what": "event", "sequence": s,
                  "type": self.events[s - 1]["type"], "tenantId": self.events[s - 1]["tenantId"],
                  "subject": self.events[s - 1]["subject"]}
                 for s in (visible if watched is None else watched)]
        rows = [{"tenantId": t, "bookedGpuSeconds": n} for t, n in (usage or {}).items()]
        return [*self.records, *lines,
                {"kind": "log", "events": self.events},
                {"kind": "visible", "watcher": "w-acme", "tenant": "acme", "head": 0,
                 "sequences": visible},
                {"kind": "usage", "report": {"from": at(0), "to": at(3000), "now": at(3000),
                                             "rows": rows}},
                {"kind": "verify", "code": 0 if verify_ok else 1,
                 "report": {"ok": verify_ok, "problems": [] if verify_ok else ["x differs"]}}]


def broken(records: list[dict[str, Any]]) -> set[str]:
    violations, _ = check(records)
    assert all(v.records for v in violations)  # each with its slice of the history
    return {v.invariant for v in violations}


def clean() -> Log:
    log = Log()
    log.reserve("rsv_1", "acme", ["g0", "g1"], 0, 600, "c0-1")
    log.release("rsv_1", "acme", 60)
    log.reserve("rsv_2", "acme", ["g0"], 60, 600, "c0-2")  # starts where rsv_1 ended
    log.reserve("rsv_3", "root", ["g2"], 0, 120, "c1-1")
    return log


USAGE = {"acme": 2 * 60 + 1 * 540, "root": 120}  # GPU-seconds of the recorded intervals


def test_a_clean_history_breaks_nothing() -> None:
    violations, checked = check(clean().finish(usage=USAGE))
    assert violations == [] and checked >= 10


def test_each_invariant_is_reported_when_the_record_breaks_it() -> None:
    seen: set[str] = set()

    overlap = clean()
    overlap.reserve("rsv_4", "root", ["g0"], 59, 90, "c1-2")  # g0 still rsv_1's until 60
    seen |= broken(overlap.finish(usage={**USAGE, "root": 120 + 31}))
    assert "gpu-booked-twice" in seen

    over = clean()
    over.reserve("rsv_5", "acme", ["g3", "g4", "g5", "g6"], 100, 200, "c0-3")  # 1 + 4 > 4
    assert "quota-exceeded" in broken(over.finish(usage={**USAGE, "acme": USAGE["acme"] + 400}))

    lost = clean()
    lost.records.append({**lost.records[1], "params": {**lost.records[1]["params"],
                                                        "key": "c0-9"},
                         "result": {"id": "rsv_9", "state": "placed"}})
    assert "acknowledged-lost" in broken(lost.finish(usage=USAGE))

    phantom = clean()
    phantom.records = [r for r in phantom.records
                       if r.get("params", {}).get("key") != "c1-1"]  # no call behind rsv_3
    assert "effect-without-call" in broken(phantom.finish(usage=USAGE))

    twice = clean()
    twice.records.append({**twice.records[1], "result": {"id": "rsv_other", "state": "placed",
                                                         "start": at(0)}})
    assert "key-booked-twice" in broken(twice.finish(usage=USAGE))

    revoked = clean()
    revoked.records += [
        {"kind": "call", "client": "operator", "tenant": "root", "method": "tokens.revoke",
         "params": {"tokenId": "tok_x"}, "sent": 1, "done": 2, "outcome": "ack", "code": None},
        {"kind": "call", "client": "operator", "tenant": "root", "method": "system.whoami",
         "params": {}, "sent": 3, "done": 4, "outcome": "ack", "code": None,
         "note": "token tok_x revoked"}]
    assert "revoked-token-accepted" in broken(revoked.finish(usage=USAGE))

    log = clean()
    visible = [e["sequence"] for e in log.events if e["tenantId"] == "acme"]
    assert "watch-gap" in broken(log.finish(watched=visible[:1] + visible[2:], usage=USAGE))
    assert "watch-order" in broken(log.finish(watched=[visible[1], visible[0], *visible[2:]],
                                              usage=USAGE))
    roots = [e["sequence"] for e in log.events if e["tenantId"] == "root"]
    assert "watch-foreign-event" in broken(log.finish(watched=sorted(visible + roots[:1]),
                                                      usage=USAGE))
    assert "store-verify" in broken(log.finish(usage=USAGE, verify_ok=False))
    assert "usage" in broken(log.finish(usage={**USAGE, "acme": 1}))

    record = clean()
    record.events[1]["data"]["start"] = at(1)  # the booking says 1 s later than rsv_1
    assert "booking-record" in broken(record.finish(usage=USAGE))
    assert seen <= set(INVARIANTS)
