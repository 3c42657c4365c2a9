"""The node session between bcd and the gateway (``serve --gateway-listen``).

Transport: TLS with client certificates (the node certificate from the node
CA, the node key generated on the machine), then newline-delimited JSON
messages, one per line, in both directions. Each message is a tagged msgspec
Struct (field ``type``). Unknown fields are ignored and unknown message types
are skipped, so either side can be upgraded first.

Session:
1. bcd sends Hello. The gateway checks that the certificate's node id equals
   Hello.node_id, bumps the node's session epoch (event ``node.connected``)
   and answers Welcome(epoch). A newer session fences the older one off: the
   gateway closes it, and any message carrying a stale epoch is refused.
2. Down: DesiredState whenever the node's desired generation changes (and once
   after Welcome). Sections: ``acceptance`` (checks to run), ``devices``
   (device assignments), more later. bcd applies it idempotently and reports.
3. Up: Heartbeat (every ``heartbeat_seconds``), Report (applied and observed
   generation, inventory and telemetry: api/wire/inventory.py, per-section state) and Journal (entries
   signed with the node key; the gateway verifies each against the key
   recorded at join before it changes any state). The gateway answers Ack for
   journal entries it accepted and Nack(code, message) for refused ones.

Sections of DesiredState (the control plane owns their content; bcd applies; their
Structs, which bcd reads each section with, are in api/wire/sections.py):
- ``acceptance``: ``{"attempt": N, "checks": [{"kind": "diag.nvml", "expect":
  {"gpuCount": 8, "gpuModel": "H100"}}]}``. bcd runs each check against its GPU
  source and journals one ``acceptance.result`` entry per attempt.
- ``devices``: ``{"assignments": [{"allocationId": "alloc_…", "reservationId":
  "rsv_…", "gpus": ["GPU-…", …], "cpus": N, "memoryGiB": M}]}`` (reservations);
  ``"kubernetes": true`` on an assignment hands its GPUs to the kubelet.
- ``kubernetes``: ``{"resourceName": "bcd.dev/gpu"}`` (the pool's policy.kubernetes):
  bcd serves its kubelet device plugin (docs/kubernetes.md).
- ``profile``: ``{"units": ["container-toolkit"]}`` (the pool's policy.nodeProfile):
  units bcd runs on the node, applied before ``devices``.

Certificate renewal: bcd sends Renew(epoch, csrPem) when its certificate has
less than a third of its lifetime left (checked when a session starts and
then periodically). The gateway issues a new certificate from the node CA for
the CSR's key only when that key's pin is the one the node joined with, and
answers Renewed(certificatePem, notAfter); otherwise Refused with a code
starting ``renew_`` (``renew_wrong_key``, ``renew_bad_csr``,
``renew_unavailable``), which does NOT end the session. A gateway that does
not know Renew skips it (unknown type); bcd simply tries again later.

Journal entry payloads (JSON, signed by the node key; their Structs, which the gateway decodes
each entry with, are in api/wire/journal.py), common fields ``{"kind", "nodeId", "epoch",
"time"}`` plus:
- ``acceptance.result``: ``attempt``, ``passed`` (bool), ``checks``: list of
  ``{"kind", "passed", "message"}``, ``gpus``: the inventory's GPU list.
- ``allocation.bound``: ``allocationId``, ``gpus``, ``cdiDevices``,
  ``envFile``, ``cgroupParent``, ``cdiSpec`` (path).
- ``allocation.failed``: ``allocationId``, ``reason`` (overlap,
  device-missing, resources-exhausted), ``message``.
- ``allocation.released``: ``allocationId``.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from .bounds import MAX_ITEMS, Id, Name, Pem, Version, clip
from .inventory import Inventory, Telemetry


class Msg(msgspec.Struct, rename="camel", tag_field="type", kw_only=True):
    """Base of session messages; ``type`` is the tag."""


class Hello(Msg, tag="hello", kw_only=True):
    node_id: Id
    bcd_version: Version | None = None
    applied_generation: int = 0
    observed_generation: int = 0


class Welcome(Msg, tag="welcome", kw_only=True):
    epoch: int
    heartbeat_seconds: float = 5.0


class Refused(Msg, tag="refused", kw_only=True):
    code: str
    message: str


class DesiredState(Msg, tag="desired", kw_only=True):
    epoch: int
    generation: int
    sections: dict[str, Any] = {}  # by name, unknown ones kept (api/wire/sections.py reads them)


class Heartbeat(Msg, tag="heartbeat", kw_only=True):
    epoch: int
    time: Name  # RFC 3339, the node's clock


class SectionState(msgspec.Struct, rename="camel", kw_only=True):
    """One section of the desired state as bcd applied it (in Report.sections, and in bcd's
    state file).

    ``state``: ``passed`` / ``failed`` (checks, or device assignments that failed),
    ``applied`` (nothing left to do) or ``unsupported`` (a section this bcd does not know).
    """

    state: Name
    message: str = ""  # cut to MAX_MESSAGE characters (api/wire/bounds.py)
    generation: int = 0
    attempt: int | None = None
    since: Name | None = None  # RFC 3339, when the state last changed

    def __post_init__(self) -> None:
        self.message = clip(self.message) or ""


class Report(Msg, tag="report", kw_only=True):
    """Where bcd stands: generations, each section's state, what its GPU source read."""

    epoch: int
    applied_generation: int
    observed_generation: int
    sections: Annotated[dict[Name, SectionState], msgspec.Meta(max_length=MAX_ITEMS)] = {}
    inventory: Inventory | None = None
    telemetry: Telemetry | None = None


class SignedEntry(msgspec.Struct, rename="camel", kw_only=True):
    payload: str  # base64 of the entry JSON, exactly as signed (the line's 1 MiB bounds it)
    signature: Annotated[str, msgspec.Meta(max_length=1024)]  # base64 ECDSA-P256-SHA256 (DER)


class Journal(Msg, tag="journal", kw_only=True):
    epoch: int
    seq: int  # the node's own journal sequence, strictly increasing
    entry: SignedEntry


class Ack(Msg, tag="ack", kw_only=True):
    seq: int


class Nack(Msg, tag="nack", kw_only=True):
    seq: int
    code: str
    message: str


class Renew(Msg, tag="renew", kw_only=True):
    """A CSR for the node's SAME key (it never leaves the machine), for a fresh certificate."""

    epoch: int
    csr_pem: Pem


class Renewed(Msg, tag="renewed", kw_only=True):
    """The fresh node certificate (PEM, from the node CA) and its end (RFC 3339)."""

    certificate_pem: str
    not_after: str


ToNode = Welcome | Refused | DesiredState | Ack | Nack | Renewed
ToGateway = Hello | Heartbeat | Report | Journal | Renew

_to_node = msgspec.json.Decoder(ToNode)
_to_gateway = msgspec.json.Decoder(ToGateway)
_encoder = msgspec.json.Encoder()


def encode(message: Msg) -> bytes:
    return _encoder.encode(message) + b"\n"


def decode_to_node(line: bytes) -> ToNode:
    return _to_node.decode(line)


def decode_to_gateway(line: bytes) -> ToGateway:
    return _to_gateway.decode(line)
