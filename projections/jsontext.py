"""JSON columns of the read models as text, written and read by msgspec (in C).

The read models keep documents and small lists as JSON text; Python's ``json`` spent a
tenth of a reservation create's server time writing and reading them. What is written is
plain JSON either way (compact, no spaces), and rows written by ``json.dumps`` read back
the same.
"""

from __future__ import annotations

from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def dumps(value: Any) -> str:
    return _ENCODER.encode(value).decode()


def loads(text: str | bytes) -> Any:
    return _DECODER.decode(text)
