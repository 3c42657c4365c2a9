"""bcd's durable journal: what the node did, signed by its key, written before it is sent.

One JSON object per line in BCD_ROOT/var/lib/bcd/journal.jsonl:

* an entry: ``{"seq": N, "key": "acceptance.result/3", "payload": b64, "signature": b64}``:
  ``payload`` is the entry JSON exactly as signed (api/wire/gateway.py lists the kinds);
  ``key`` names the fact once (an acceptance attempt, an allocation's binding), so an
  entry is never journaled twice, not even across restarts.
* a settlement: ``{"settled": N, "outcome": "acked" | "nacked:<code>"}`` once the gateway
  answered Ack or a final Nack.

Every line is appended and fsynced before anything is sent, so an entry the gateway may
have seen is never lost, and entries not yet settled are sent again after a reconnect or
a restart. A torn last line (power lost mid-write) is cut off when the journal opens.
"""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from better_compute.api.wire.gateway import SignedEntry
from better_compute.api.wire.sealing import sign_entry

from ..errors import BcdError
from .settings import NodeKey

_encoder = msgspec.json.Encoder()


@dataclass(frozen=True)
class Entry:
    seq: int
    key: str
    signed: SignedEntry
    payload: dict[str, Any]


class Journal:
    def __init__(self, path: Path, key: NodeKey) -> None:
        self.path = path
        self._key = key
        self._entries: dict[int, Entry] = {}
        self._by_key: dict[str, int] = {}
        self._settled: dict[int, str] = {}
        # bcd appends from a worker thread (applying) and settles from the event loop.
        self._lock = threading.RLock()
        self._load()

    # -- reading ---------------------------------------------------------------

    def _load(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise BcdError(f"cannot read the journal {self.path}: {exc.strerror}") from None
        good = 0
        for line in data.splitlines(keepends=True):
            try:
                record = msgspec.json.decode(line)
                self._apply(record)
            except (msgspec.DecodeError, KeyError, TypeError, ValueError):
                if not line.endswith(b"\n") or good + len(line) == len(data):
                    break  # a torn last line: cut it off below
                raise BcdError(
                    f"the journal {self.path} is damaged at byte {good}: move it away to "
                    "start a new one (entries the gateway acknowledged are safe on its side)"
                ) from None
            good += len(line)
        if good != len(data):
            with open(self.path, "r+b") as handle:
                handle.truncate(good)
                os.fsync(handle.fileno())

    def _apply(self, record: dict[str, Any]) -> None:
        if "settled" in record:
            self._settled[int(record["settled"])] = str(record["outcome"])
            return
        payload_b64, signature_b64 = str(record["payload"]), str(record["signature"])
        payload = msgspec.json.decode(base64.b64decode(payload_b64))
        entry = Entry(int(record["seq"]), str(record["key"]),
                      SignedEntry(payload=payload_b64, signature=signature_b64), payload)
        self._entries[entry.seq] = entry
        self._by_key[entry.key] = entry.seq

    @property
    def next_seq(self) -> int:
        return max(self._entries, default=0) + 1

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._by_key

    def payload_of(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            seq = self._by_key.get(key)
            return None if seq is None else self._entries[seq].payload

    def unsettled(self) -> list[Entry]:
        with self._lock:
            return [self._entries[seq] for seq in sorted(self._entries)
                    if seq not in self._settled]

    def outcome(self, seq: int) -> str | None:
        with self._lock:
            return self._settled.get(seq)

    def entries(self) -> list[Entry]:
        with self._lock:
            return [self._entries[seq] for seq in sorted(self._entries)]

    # -- writing ---------------------------------------------------------------

    def append(self, key: str, payload: dict[str, Any]) -> Entry:
        """Sign ``payload``, write it durably, and return it; the same key twice is a bug."""
        with self._lock:
            if key in self._by_key:
                raise ValueError(f"journal entry {key!r} was already written")
            payload_b64, signature_b64 = sign_entry(self._key, _encoder.encode(payload))
            signed = SignedEntry(payload=payload_b64, signature=signature_b64)
            entry = Entry(self.next_seq, key, signed, payload)
            self._write({"seq": entry.seq, "key": key, "payload": payload_b64,
                         "signature": signature_b64})
            self._entries[entry.seq] = entry
            self._by_key[key] = entry.seq
            return entry

    def settle(self, seq: int, outcome: str) -> bool:
        """Record the gateway's final answer for ``seq``; False when unknown or already settled."""
        with self._lock:
            if seq not in self._entries or seq in self._settled:
                return False
            self._write({"settled": seq, "outcome": outcome})
            self._settled[seq] = outcome
            return True

    def _write(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, _encoder.encode(record) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
