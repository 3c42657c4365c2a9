"""How long the strings and lists a node sends may be (docs/security.md, "Bounds").

Checked when a message is decoded, so a field past its bound refuses the whole message
before anything is stored: a Hello (``Refused bad_hello``), a journal entry (``Nack
malformed``), a join request (``invalid_input``); a Report that does not fit is skipped.
Free-text messages (why a check failed, why a hold could not be made) are cut to
``MAX_MESSAGE`` instead: they explain, and a long one should not lose the rest of its
message. Every line the gateway reads is at most 1 MiB besides (api/gateway/session.py).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

MAX_ID = 128  # node, allocation and reservation ids, GPU UUIDs, serials, PCI bus ids, MACs
MAX_NAME = 256  # GPU names, products, hostnames, kinds, states, reasons, times, sources
MAX_VERSION = 64  # bcd's and the driver's versions
MAX_PATH = 4096  # files on the node (CDI specs, env files)
MAX_PEM = 16_384  # a certificate signing request
MAX_MESSAGE = 4_000  # free text: cut to this many characters
MAX_GPUS = 64  # GPUs of one node (also in its telemetry and its acceptance result)
MAX_ITEMS = 64  # any other list: health reasons, checks, sections, CDI devices
MAX_MACS = 1024  # a host's MACs (a NIC's SR-IOV functions each have one)

Id = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
NonEmptyId = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID)]
Name = Annotated[str, msgspec.Meta(max_length=MAX_NAME)]
Version = Annotated[str, msgspec.Meta(max_length=MAX_VERSION)]
FilePath = Annotated[str, msgspec.Meta(max_length=MAX_PATH)]
Pem = Annotated[str, msgspec.Meta(max_length=MAX_PEM)]
Ids = Annotated[list[Id], msgspec.Meta(max_length=MAX_ITEMS)]
Macs = Annotated[list[Id], msgspec.Meta(max_length=MAX_MACS)]
Names = Annotated[list[Name], msgspec.Meta(max_length=MAX_ITEMS)]


def clip(text: str | None) -> str | None:
    """A free-text message cut to ``MAX_MESSAGE`` characters (an ellipsis says so)."""
    if text is None or len(text) <= MAX_MESSAGE:
        return text
    return text[:MAX_MESSAGE - 1] + "…"
