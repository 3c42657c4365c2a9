"""Log lines of ``serve`` and ``bcd node``: text or JSON, time, level, logger, never a secret.

Shared by the control plane and bcd (``--log-format text|json``). A text line is

    2025-06-01T12:00:00.123Z INFO better_compute.request: rpc nodes.list ok request_id=… …

and a JSON line one object: ``{"time", "level", "logger", "message", …fields}``. Fields
come from ``extra={"fields": {...}}`` (a request's id, method, tenant, duration and
error code: api/http/request_log.py). Every line passes :func:`redact` last: API tokens,
join tokens, the master key, PEM private keys and URL passwords become ``***`` even
when a library puts them into an error message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from better_compute.domain.visible import visible, visible_json

FORMATS = ("text", "json")
LEVELS = ("critical", "error", "warning", "info", "debug")
# The secrets' own prefixes (domain/token.py, domain/join_token.py, api/pki.py; a unit test
# keeps them in step): bcd ships without those modules.
SECRET_PREFIXES = ("biam_", "bcjt_", "bcmk1_")
_SECRETS = re.compile(
    "|".join([*(rf"{p}[A-Za-z0-9_.~+/=-]+" for p in SECRET_PREFIXES),
              r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)"]),
    re.DOTALL)
_URL_PASSWORD = re.compile(r"(://[^\s:@/?#]*):[^\s@/?#]*@")


def redact(text: str) -> str:
    """``text`` with token and key material replaced by ``***``."""
    return _URL_PASSWORD.sub(r"\1:***@", _SECRETS.sub("***", text))


def timestamp(seconds: float) -> str:
    """RFC 3339, UTC, milliseconds: 2025-06-01T12:00:00.123Z."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{whole}.{int(seconds % 1 * 1000):03d}Z"


def line(log_format: str, when: float, level: str, logger: str, message: str,
         fields: Mapping[str, Any] | None = None, *, keep: str = "") -> str:
    """One log line, redacted, every hidden character escaped (domain/visible.py): in a
    text line as ``\\x1b``, in a JSON line as JSON writes it (``\\u001b``), so a node's
    text can neither act on the terminal that reads the log nor start a line of its own.
    ``keep``: characters of ``message`` that stay (the newlines of a traceback)."""
    if log_format == "json":
        document = {"time": timestamp(when), "level": level.lower(), "logger": logger,
                    "message": message, **(fields or {})}
        return redact(visible_json(json.dumps(document, default=str, ensure_ascii=False)))
    tail = "".join(f" {k}={_text_value(v)}" for k, v in (fields or {}).items())
    return redact(f"{timestamp(when)} {level.upper()} {logger}: {visible(message, keep)}"
                  f"{visible(tail)}")


def _text_value(value: Any) -> str:
    text = "-" if value is None else str(value)
    return json.dumps(text, ensure_ascii=False) \
        if not text or any(c.isspace() or c in '"=' for c in text) else text


class LineFormatter(logging.Formatter):
    """:func:`line` for the logging module; tracebacks are part of the message."""

    def __init__(self, log_format: str) -> None:
        super().__init__()
        self.log_format = log_format

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if self.log_format == "text":  # one line, whatever the message holds
            message = visible(message)
        if record.exc_info:  # a traceback's lines stay lines
            message = f"{message}\n{self.formatException(record.exc_info)}"
        fields = getattr(record, "fields", None)
        return line(self.log_format, record.created, record.levelname, record.name, message,
                    fields if isinstance(fields, Mapping) else None, keep=_LINES)


_LINES = "\n"


def configure(level: str, log_format: str, stream: TextIO | None = None,
              filters: Sequence[logging.Filter] = ()) -> None:
    """Every logger of this process writes lines of ``log_format`` to ``stream`` (stderr)."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LineFormatter(log_format))
    for each in filters:
        handler.addFilter(each)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
