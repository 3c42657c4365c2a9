"""One API request as the logs and the metrics see it: its id, method, tenant, error code.

The RPC endpoint opens a :class:`RequestRecord` for each request (``recording``); the
dispatcher fills it in as it learns things (``authenticated``, ``answered``,
``store_failed``), in whichever thread it runs (the record travels in a context
variable, which anyio copies into the worker thread). When the answer is written, the
endpoint counts it in the metrics and, at level info, logs one line
(logger ``better_compute.request``): request id, method, tenant, actor (token id),
duration and error code. Never the token, the params or the result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from better_compute.domain.access import Principal

REQUEST_ID_HEADER = "x-request-id"
log = logging.getLogger("better_compute.request")
_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,64}\Z")
_STORE_ERROR_MODULES = ("eventsourcing.persistence", "sqlite3", "psycopg")


@dataclass
class RequestRecord:
    request_id: str
    method: str = "invalid"  # the JSON-RPC method; "unknown" for one that does not exist
    code: str = "invalid_request"  # "ok" or the error's stable code
    tenant: str | None = None
    actor: str | None = None
    store_error: bool = False
    client: str | None = None  # the caller's address (api/http/serve.py: trusted proxies)


_current: ContextVar[RequestRecord | None] = ContextVar("better_compute_request", default=None)
# The endpoint sets and resets it directly (a context manager costs microseconds per call).
CURRENT = _current


def new_request_id(given: str | None) -> str:
    """The caller's X-Request-Id when it is a sane one (to follow a call across systems),
    else a fresh random one."""
    return given if given and _ID_RE.match(given) else os.urandom(8).hex()


@contextlib.contextmanager
def recording(record: RequestRecord) -> Iterator[RequestRecord]:
    token = _current.set(record)
    try:
        yield record
    finally:
        _current.reset(token)


def authenticated(principal: Principal) -> None:
    record = _current.get()
    if record is not None:
        record.tenant, record.actor = principal.tenant_id, principal.token_id


def answered(method: str, error: Any) -> None:
    """The dispatcher's answer: ``error`` is the RpcError, or unset for a result."""
    record = _current.get()
    if record is not None:
        record.method = method
        data = getattr(error, "data", None)  # an RpcError's, with the stable code
        record.code = "ok" if data is None else str(data.get("code") or "internal")


def store_failed(exc: BaseException) -> None:
    """Note that the request failed in the store (a database error, not a refusal)."""
    record = _current.get()
    if record is not None and (is_store_error(exc) or getattr(exc, "code", None) == "unavailable"):
        record.store_error = True


def is_store_error(exc: BaseException) -> bool:
    return any(cls.__module__.startswith(_STORE_ERROR_MODULES) for cls in type(exc).__mro__)


class RequestFields(logging.Filter):
    """Adds the request's id and method to every line logged while answering it (an
    internal error's traceback, a library's warning), in whichever thread."""

    def filter(self, record: logging.LogRecord) -> bool:
        current = _current.get()
        if current is not None and not hasattr(record, "fields"):
            record.fields = {"request_id": current.request_id, "method": current.method}
        return True


def log_request(record: RequestRecord, seconds: float) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("rpc %s %s", record.method, record.code, extra={"fields": {
            "request_id": record.request_id, "method": record.method, "tenant": record.tenant,
            "actor": record.actor, "duration_ms": round(seconds * 1000, 3),
            "code": record.code, "client": record.client}})
