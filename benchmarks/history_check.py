"""The invariants a history of benchmarks/history.py must keep, checked on its records alone.

The records: every call (request, answer or how it failed, when), every watcher's lines, the
faults, then the event log as root reads it (``log``), what each watcher's tenant reads of it
(``visible``), ``usage.report`` and ``store verify``. From the log alone the reservations and
the bookings are rebuilt, event by event in sequence order, and:

- ``gpu-booked-twice``: no GPU in two bookings whose recorded intervals overlap (a booking
  holds its GPUs from its start to its end, or to when it ended early);
- ``booking-record``: a reservation placed once records the start, GPUs and end its booking
  records (what usage and audits read);
- ``quota-exceeded``: at no point of the log does a tenant hold more GPUs of a pool than its
  quota (a reservation holds its GPUs' quota from its placement to its end);
- ``acknowledged-lost``: every acknowledged create, release, cancel and extend is in the log
  with its effect (the reservation, its key, GPU count and start; its end; its new end);
- ``effect-without-call``: every reservation, release, cancel and extend in the log has an
  acknowledged call, or one whose outcome is unknown (it timed out, its server died), behind
  it; every token revoke too;
- ``key-booked-twice``: every answer to one key names one reservation, and a reservation holds
  at most one booking at a time;
- ``revoked-token-accepted``: a token is refused once its revoke was acknowledged;
- ``watch-order``, ``watch-gap``, ``watch-foreign-event``: every /watch stream, across its
  reconnects, strictly increases, misses no event its tenant can list up to where it read,
  and holds no event its tenant cannot list;
- ``store-verify``: ``store verify`` is clean (the log reads whole, every aggregate replays,
  every read model equals a rebuild);
- ``usage``: usage's booked GPU-seconds per tenant equal the sum of the recorded intervals.

A broken invariant comes with the smallest slice of the history that shows it: the calls,
the log events and the stream lines of the objects involved.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

INVARIANTS = ("gpu-booked-twice", "booking-record", "quota-exceeded", "acknowledged-lost",
              "effect-without-call", "key-booked-twice", "revoked-token-accepted",
              "watch-order", "watch-gap", "watch-foreign-event", "store-verify", "usage")
HOLDING = ("placed", "binding", "active")
TERMINAL = ("released", "cancelled", "failed", "expired")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_PER_INVARIANT = 3  # violations shown of each invariant (all are counted)


@dataclass
class Violation:
    invariant: str
    message: str
    records: list[dict[str, Any]]  # the smallest slice of the history that shows it


def us(text: Any) -> int:
    """An RFC 3339 time as integer microseconds since the epoch (exact, as usage counts)."""
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    return (moment - EPOCH) // timedelta(microseconds=1)


@dataclass
class Rsv:
    """A reservation as its events in the log record it."""

    id: str
    tenant: str
    pool: str
    gpus: int
    key: str | None
    created: dict[str, Any]  # the event that created it
    state: str = ""
    start: int | None = None
    end: int | None = None
    ended: int | None = None
    starts: set[int] = field(default_factory=set)  # every start it recorded
    gpu_lists: list[list[str]] = field(default_factory=list)
    placements: int = 0  # placed, dequeued, replaced, rescheduled: each a new booking
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def holding(self) -> bool:
        return self.state in HOLDING


@dataclass
class Booking:
    allocation: str
    reservation: str
    gpus: list[str]
    start: int
    end: int
    ended: int | None = None
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def until(self) -> int:
        return self.end if self.ended is None else min(self.end, self.ended)


class Checker:
    def __init__(self, records: Sequence[dict[str, Any]]) -> None:
        self.records = records
        self.violations: list[Violation] = []
        self.checked = 0
        self.log = sorted((e for r in records if r["kind"] == "log" for e in r["events"]),
                          key=lambda e: int(e["sequence"]))
        self.calls = [r for r in records if r["kind"] == "call"]
        setups = [r for r in records if r["kind"] == "setup"]
        self.setup = setups[0] if setups else {"quotas": {}, "watchers": {}}
        self.rsvs: dict[str, Rsv] = {}
        self.bookings: dict[str, Booking] = {}
        self.by_sequence = {int(e["sequence"]): e for e in self.log}

    # ---------------------------------------------------------------- helpers

    def broken(self, invariant: str, message: str, records: Iterable[dict[str, Any]]) -> None:
        seen: set[str] = set()
        unique = []
        for record in records:
            text = json.dumps(record, sort_keys=True)
            if text not in seen:
                seen.add(text)
                unique.append(record)
        self.violations.append(Violation(invariant, message, unique))

    def calls_about(self, rsv_id: str) -> list[dict[str, Any]]:
        rsv = self.rsvs.get(rsv_id)
        key = rsv.key if rsv else None
        return [c for c in self.calls
                if (c["params"].get("reservationId") == rsv_id
                    or (c.get("result") or {}).get("id") == rsv_id
                    or (key is not None and c["method"] == "reservations.create"
                        and c["params"].get("key") == key and rsv is not None
                        and c["tenant"] == rsv.tenant))]

    def about(self, rsv_id: str) -> list[dict[str, Any]]:
        """The log events and the calls of one reservation, and its bookings' events."""
        rsv = self.rsvs.get(rsv_id)
        out = [*(rsv.events if rsv else [])]
        out += [e for b in self.bookings.values() if b.reservation == rsv_id for e in b.events]
        return sorted(out, key=lambda e: int(e["sequence"])) + self.calls_about(rsv_id)

    # ---------------------------------------------------------------- rebuild

    def rebuild(self) -> None:
        """Reservations and bookings from the log, and the quota held at every point."""
        quotas = {t: int(q) for t, q in self.setup["quotas"].items()}
        held: dict[tuple[str, str], int] = defaultdict(int)
        over: set[tuple[str, str]] = set()
        for event in self.log:
            kind, data = str(event["type"]), event.get("data") or {}
            if kind.startswith("bookings."):
                self._booking(kind, data, event)
                continue
            if not kind.startswith("reservation."):
                continue
            rsv = self.rsvs.get(event["subject"])
            if rsv is None:
                rsv = self.rsvs[event["subject"]] = Rsv(
                    event["subject"], event["tenantId"], str(data.get("poolId")),
                    int(data.get("gpuCount", 0)), data.get("key"), event)
            was = rsv.holding
            self._reservation(rsv, kind, data, event)
            if rsv.holding != was:
                where = (rsv.tenant, rsv.pool)
                held[where] += rsv.gpus if rsv.holding else -rsv.gpus
                self.checked += 1
                quota = quotas.get(rsv.tenant)
                if quota is not None and held[where] > quota and where not in over:
                    over.add(where)
                    holders = [r for r in self.rsvs.values()
                               if r.holding and (r.tenant, r.pool) == where]
                    self.broken("quota-exceeded",
                                f"tenant {rsv.tenant} holds {held[where]} GPUs of pool "
                                f"{rsv.pool} at sequence {event['sequence']}, over its quota of "
                                f"{quota}: {', '.join(r.id for r in holders)}",
                                [r.created for r in holders] + [event]
                                + [c for r in holders for c in self.calls_about(r.id)
                                   if c["method"] == "reservations.create"])

    def _reservation(self, rsv: Rsv, kind: str, data: dict[str, Any],
                     event: dict[str, Any]) -> None:
        rsv.events.append(event)
        state = kind.split(".", 1)[1]
        if state in ("placed", "dequeued", "rescheduled"):
            rsv.start, rsv.end = us(data["start"]), us(data["end"])
            rsv.starts.add(rsv.start)
        if state in ("placed", "dequeued", "replaced", "rescheduled"):
            rsv.gpu_lists.append(list(data.get("gpus") or []))
            rsv.placements += 1
        if state == "extended":
            rsv.end = us(data["end"])
        if state in TERMINAL:
            rsv.ended = us(data["at"])
        if state in ("placed", "queued", "binding", "active", *TERMINAL):
            rsv.state = state
        elif state in ("dequeued", "replaced"):
            rsv.state = "placed"

    def _booking(self, kind: str, data: dict[str, Any], event: dict[str, Any]) -> None:
        allocation = str(data.get("allocationId"))
        if kind == "bookings.booked":
            self.bookings[allocation] = Booking(allocation, str(data["reservationId"]),
                                                list(data["gpus"]), us(data["start"]),
                                                us(data["end"]), events=[event])
            return
        booking = self.bookings.get(allocation)
        if booking is None:
            return
        booking.events.append(event)
        if kind == "bookings.extended":
            booking.end = us(data["end"])
        elif kind == "bookings.ended":
            booking.ended = us(data["at"])

    # ---------------------------------------------------------------- invariants

    def no_gpu_booked_twice(self) -> None:
        by_gpu: dict[str, list[Booking]] = defaultdict(list)
        for booking in self.bookings.values():
            if booking.until > booking.start:
                for gpu in booking.gpus:
                    by_gpu[gpu].append(booking)
        for gpu, bookings in sorted(by_gpu.items()):
            bookings.sort(key=lambda b: (b.start, b.allocation))
            widest: Booking | None = None
            for booking in bookings:
                self.checked += 1
                if widest is not None and booking.start < widest.until:
                    self.broken("gpu-booked-twice",
                                f"GPU {gpu} is in {widest.reservation} until "
                                f"{_iso(widest.until)} and in {booking.reservation} from "
                                f"{_iso(booking.start)}: the recorded intervals overlap by "
                                f"{(widest.until - booking.start) / 1000:.1f} ms",
                                self.about(widest.reservation) + self.about(booking.reservation))
                if widest is None or booking.until > widest.until:
                    widest = booking

    def bookings_match_reservations(self) -> None:
        by_rsv: dict[str, list[Booking]] = defaultdict(list)
        for booking in self.bookings.values():
            by_rsv[booking.reservation].append(booking)
        for rsv in self.rsvs.values():
            if rsv.placements != 1 or rsv.start is None:
                continue
            self.checked += 1
            mine = by_rsv.get(rsv.id, [])
            own = mine[0] if len(mine) == 1 else None
            problem = None
            if own is None:
                problem = f"{len(mine)} bookings"
            elif own.start != rsv.start or sorted(own.gpus) != sorted(rsv.gpu_lists[0]):
                problem = (f"start {_iso(rsv.start)} and GPUs {rsv.gpu_lists[0]}, its booking "
                           f"{_iso(own.start)} and {own.gpus}")
            elif rsv.ended is not None and own.ended is not None and \
                    min(rsv.ended, rsv.end or 0) != own.until:
                problem = (f"it ended at {_iso(min(rsv.ended, rsv.end or 0))}, its booking at "
                           f"{_iso(own.until)}")
            if problem:
                self.broken("booking-record", f"reservation {rsv.id} records {problem}",
                            self.about(rsv.id))

    def acknowledged_in_the_log(self) -> None:
        for call in self.calls:
            if call["outcome"] != "ack" or not call["method"].startswith("reservations.") \
                    or call["method"] in ("reservations.get", "reservations.list"):
                continue
            self.checked += 1
            answer = call.get("result") or {}
            rsv = self.rsvs.get(str(answer.get("id")))
            problem = self._ack_problem(call, answer, rsv)
            if problem:
                self.broken("acknowledged-lost",
                            f"{call['method']} by {call['client']} was acknowledged, but "
                            f"{problem}", [call, *(self.about(rsv.id) if rsv else [])])

    def _ack_problem(self, call: dict[str, Any], answer: dict[str, Any], rsv: Rsv | None
                     ) -> str | None:
        method, params = call["method"], call["params"]
        if rsv is None:
            return f"the log holds no reservation {answer.get('id')}"
        state = answer.get("state")
        if method == "reservations.create":
            if rsv.key != params.get("key") or rsv.gpus != params.get("gpus"):
                return (f"the log's {rsv.id} has key {rsv.key} and {rsv.gpus} GPUs, the call "
                        f"{params.get('key')} and {params.get('gpus')}")
            if state in HOLDING and answer.get("start") and us(answer["start"]) not in rsv.starts:
                return f"the log never records {rsv.id} starting at {answer['start']}"
            if state == "queued" and rsv.created["type"] != "reservation.queued":
                return f"the log created {rsv.id} {rsv.created['type']}, not queued"
        if state in TERMINAL and rsv.state != state:
            return f"it answered {rsv.id} {state}, the log leaves it {rsv.state}"
        if method == "reservations.release" and state == "released" and answer.get("endedAt") \
                and rsv.ended != us(answer["endedAt"]):
            return f"the log ends {rsv.id} at {_iso(rsv.ended)}, not {answer['endedAt']}"
        if method == "reservations.extend":
            ends = {us(e["data"]["end"]) for e in rsv.events
                    if e["type"] == "reservation.extended"}
            if us(answer["end"]) not in ends:
                return f"the log never extends {rsv.id} to {answer['end']}"
        return None

    def every_effect_has_a_call(self) -> None:
        creates: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        changes: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for call in self.calls:
            if call["method"] == "reservations.create":
                creates[(call["tenant"], str(call["params"].get("key")))].append(call)
            elif call["method"] in ("reservations.release", "reservations.cancel",
                                    "reservations.extend", "tokens.revoke"):
                target = call["params"].get("reservationId") or call["params"].get("tokenId")
                changes[(call["method"], str(target))].append(call)

        def live(calls: list[dict[str, Any]]) -> int:
            return sum(1 for c in calls if c["outcome"] in ("ack", "unknown"))

        clients = set(self.setup.get("clients", {})) | {"operator"}
        for rsv in self.rsvs.values():
            if rsv.key is None or rsv.key.rsplit("-", 1)[0] not in clients:
                continue  # not made by a client of this history
            self.checked += 1
            if not live(creates[(rsv.tenant, rsv.key)]):
                self.broken("effect-without-call",
                            f"{rsv.id} (key {rsv.key}) is in the log, but no create with its "
                            "key was acknowledged or left unanswered", self.about(rsv.id))
            effects: tuple[tuple[str, str, str | None], ...] = (
                ("reservation.released", "reservations.release", "released"),
                ("reservation.cancelled", "reservations.cancel", None),
                ("reservation.extended", "reservations.extend", None))
            for kind, method, reason in effects:
                done = [e for e in rsv.events if e["type"] == kind
                        and (reason is None or e["data"].get("reason") == reason)]
                if done:
                    self.checked += 1
                if len(done) > live(changes[(method, rsv.id)]):
                    self.broken("effect-without-call",
                                f"{rsv.id} has {len(done)} {kind} in the log, but "
                                f"{live(changes[(method, rsv.id)])} {method} calls were "
                                "acknowledged or left unanswered", self.about(rsv.id))
        revoked = [e for e in self.log if e["type"] == "token.revoked"]
        for event in revoked:
            self.checked += 1
            if not live(changes[("tokens.revoke", event["subject"])]):
                self.broken("effect-without-call",
                            f"token {event['subject']} is revoked in the log, but no revoke "
                            "was acknowledged or left unanswered", [event])

    def one_reservation_per_key(self) -> None:
        answers: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = defaultdict(
            lambda: defaultdict(list))
        for call in self.calls:
            if call["method"] == "reservations.create" and call["outcome"] == "ack":
                where = (call["tenant"], str(call["params"].get("key")))
                answers[where][str((call.get("result") or {}).get("id"))].append(call)
        for (tenant, key), ids in answers.items():
            self.checked += 1
            if len(ids) > 1:
                self.broken("key-booked-twice",
                            f"key {key} of {tenant} was answered with {len(ids)} reservations: "
                            f"{', '.join(sorted(ids))}", [c for cs in ids.values() for c in cs])
        held: dict[str, set[str]] = defaultdict(set)
        for event in self.log:
            data = event.get("data") or {}
            if event["type"] == "bookings.booked":
                rsv = str(data["reservationId"])
                self.checked += 1
                if held[rsv]:
                    self.broken("key-booked-twice",
                                f"{rsv} was booked again ({data['allocationId']}) while it held "
                                f"{', '.join(sorted(held[rsv]))}", self.about(rsv))
                held[rsv].add(str(data["allocationId"]))
            elif event["type"] == "bookings.ended":
                booking = self.bookings.get(str(data["allocationId"]))
                if booking is not None:
                    held[booking.reservation].discard(booking.allocation)

    def revoked_tokens_refused(self) -> None:
        revoked_at: dict[str, float] = {}
        for call in self.calls:
            if call["method"] == "tokens.revoke" and call["outcome"] == "ack":
                revoked_at.setdefault(str(call["params"]["tokenId"]), float(call["done"]))
        for call in self.calls:
            note = str(call.get("note") or "")
            if not note.endswith(" revoked"):
                continue
            token = note.split()[1]
            self.checked += 1
            accepted = call["outcome"] == "ack" or (call["outcome"] == "refused"
                                                    and call["code"] != "unauthenticated")
            if token in revoked_at and call["sent"] >= revoked_at[token] and accepted:
                self.broken("revoked-token-accepted",
                            f"token {token} was revoked, then a call with it got "
                            f"{call['outcome']} {call['code'] or ''}",
                            [c for c in self.calls if token in str(c.get("note", ""))
                             or c["params"].get("tokenId") == token])

    def watch_streams(self) -> None:
        visible = {r["watcher"]: r for r in self.records if r["kind"] == "visible"}
        streams: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.records:
            if record["kind"] == "watch":
                streams[record["watcher"]].append(record)
        for name, tenant in self.setup.get("watchers", {}).items():
            lines = streams.get(name, [])
            events = [r for r in lines if r["what"] == "event"]
            listed = visible.get(name)
            if listed is None:
                continue
            may = set(listed["sequences"])
            last, found = 0, False
            for line in events:
                self.checked += 1
                if int(line["sequence"]) <= last and not found:
                    found = True
                    self.broken("watch-order",
                                f"watcher {name} got {line['sequence']} after {last}",
                                _around(lines, line, self.by_sequence))
                last = max(last, int(line["sequence"]))
                if (tenant != "root" and line["tenantId"] != tenant) or \
                        int(line["sequence"]) not in may:
                    self.broken("watch-foreign-event",
                                f"watcher {name} of tenant {tenant} got event "
                                f"{line['sequence']} ({line['type']}) of tenant "
                                f"{line['tenantId']}, which {tenant} cannot list",
                                [line, self.by_sequence.get(int(line["sequence"]), {})])
                    break
            reach = max([0, *(int(r.get("head", 0)) for r in lines if r["what"] == "heartbeat"),
                         *(int(r["sequence"]) for r in events)])
            got = {int(r["sequence"]) for r in events}
            missing = sorted(s for s in may if s <= reach and s not in got)
            self.checked += 1
            if missing:
                first = missing[0]
                self.broken("watch-gap",
                            f"watcher {name} of tenant {tenant} read up to {reach} but never "
                            f"got {len(missing)} events its tenant lists, first {first} "
                            f"({self.by_sequence.get(first, {}).get('type')})",
                            [self.by_sequence.get(first, {"sequence": first}),
                             *_around(lines, {"sequence": first}, self.by_sequence)])

    def store_verified(self) -> None:
        for record in self.records:
            if record["kind"] != "verify":
                continue
            self.checked += 1
            report = record.get("report") or {}
            if record["code"] != 0 or not report.get("ok"):
                self.broken("store-verify", "store verify is not clean: "
                            + "; ".join(str(p) for p in report.get("problems", []))[:2000],
                            [record])

    def usage_adds_up(self) -> None:
        for record in self.records:
            if record["kind"] != "usage":
                continue
            report = record["report"]
            lo, hi, now = us(report["from"]), us(report["to"]), us(report["now"])
            sums: dict[str, int] = defaultdict(int)
            for rsv in self.rsvs.values():
                if rsv.start is None or rsv.end is None:
                    continue  # never placed (queued, then cancelled or expired)
                stop = min(rsv.end, now if rsv.ended is None else rsv.ended, now, hi)
                begin = max(rsv.start, lo)
                if stop > begin:
                    sums[rsv.tenant] += (stop - begin) * rsv.gpus
            rows = {row["tenantId"]: int(row["bookedGpuSeconds"]) for row in report["rows"]}
            for tenant in sorted(set(rows) | set(sums)):
                self.checked += 1
                expected = sums.get(tenant, 0) // 1_000_000
                if rows.get(tenant, 0) != expected:
                    self.broken("usage",
                                f"usage reports {rows.get(tenant, 0)} booked GPU-seconds for "
                                f"{tenant}; its recorded intervals add up to {expected}",
                                [record, *self._usage_slice(tenant)])

    def _usage_slice(self, tenant: str) -> list[dict[str, Any]]:
        """The tenant's reservations whose booked interval usage may count otherwise: those
        queued, moved or placed again first."""
        odd = [r for r in self.rsvs.values() if r.tenant == tenant and r.start is not None
               and (r.created["type"] != "reservation.placed" or r.placements > 1)]
        return [e for r in odd[:3] for e in r.events]

    def run(self) -> None:
        self.rebuild()
        self.no_gpu_booked_twice()
        self.bookings_match_reservations()
        self.acknowledged_in_the_log()
        self.every_effect_has_a_call()
        self.one_reservation_per_key()
        self.revoked_tokens_refused()
        self.watch_streams()
        self.store_verified()
        self.usage_adds_up()


def _around(lines: list[dict[str, Any]], line: dict[str, Any],
            log: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The stream's lines from the last event before ``line``'s sequence to the first after
    it, with the reconnects in between: the smallest piece of the stream that shows it."""
    sequence = int(line["sequence"])
    events = [n for n, r in enumerate(lines) if r["what"] == "event"]
    before = [n for n in events if int(lines[n]["sequence"]) < sequence]
    after = [n for n in events if int(lines[n]["sequence"]) >= sequence]
    lo = before[-1] if before else 0
    hi = after[0] if after else len(lines) - 1
    if line in lines:
        hi = max(hi, lines.index(line))
    return lines[lo:hi + 1]


def _iso(value: int | None) -> str:
    if value is None:
        return "-"
    return (EPOCH + timedelta(microseconds=value)).isoformat().replace("+00:00", "Z")


def check(records: Sequence[dict[str, Any]]) -> tuple[list[Violation], int]:
    """The invariants broken by a history (none: an empty list), and how many checks ran."""
    checker = Checker(records)
    checker.run()
    return checker.violations, checker.checked


def describe(violations: Sequence[Violation], history: Path | str, checked: int) -> str:
    """What a person reads: each broken invariant with its slice of the history."""
    lines = [f"history: {history} ({checked} checks of {len(INVARIANTS)} invariants)"]
    if not violations:
        lines.append("every invariant holds")
    shown: dict[str, int] = defaultdict(int)
    for violation in violations:
        shown[violation.invariant] += 1
        if shown[violation.invariant] > MAX_PER_INVARIANT:
            continue
        lines.append(f"BROKEN {violation.invariant}: {violation.message}")
        for record in violation.records[:40]:
            lines.append("    " + json.dumps(record, separators=(",", ":"))[:400])
    for invariant, count in shown.items():
        if count > MAX_PER_INVARIANT:
            lines.append(f"({count - MAX_PER_INVARIANT} more {invariant} not shown)")
    return "\n".join(lines)
