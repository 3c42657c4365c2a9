"""JSON-RPC 2.0: decoding, dispatch by the table of methods (api/http/methods/table.py) and
error mapping.

Params are decoded into the method's params Struct only once the method is known. Project
errors map to JSON-RPC errors in ONE place (``_error``); so do the store's errors that mean an
outage (api/store/outage.py: ``unavailable``, with a message that says to retry); anything
else is a bug, logged with an incident id, and the peer sees no traceback.

Every failure to decode a body (bad JSON, nesting deeper than the decoder
goes, invalid UTF-8) is a JSON-RPC parse error, never ``internal``. Decoded
params pass ``check_params`` (api/http/params_bounds.py): nesting, container sizes,
string lengths and hidden characters, for every method. A request without an
``id`` is a notification: it runs, and nothing is answered (``handle``
returns b"").
"""

from __future__ import annotations

import difflib
import logging
import uuid
from collections.abc import Callable
from typing import Any

import msgspec

from better_compute.api.http import request_log
from better_compute.api.http.methods import Call, Method
from better_compute.api.http.methods.table import METHODS as METHODS  # what answer() dispatches by
from better_compute.api.http.params_bounds import check_params
from better_compute.api.http.schemas import RpcError, RpcRequest, RpcResponse
from better_compute.api.services.registry import Services
from better_compute.api.store.outage import outage_error
from better_compute.domain.access import Principal
from better_compute.domain.errors import BetterComputeError, InvalidInput

log = logging.getLogger("better_compute.rpc")

_ENCODER = msgspec.json.Encoder()
_REQUEST = msgspec.json.Decoder(RpcRequest)


def decode_params(m: Method, raw: bytes) -> Any:
    try:
        params = msgspec.json.decode(raw, type=m.params)
    except msgspec.ValidationError as exc:
        raise InvalidInput(
            f"invalid params for {m.name}: {_short(exc)}. `better-compute api rpc.discover` "
            "shows every method's params"
        ) from None
    except msgspec.DecodeError as exc:
        raise InvalidInput(f"params of {m.name} are not a JSON object: {_short(exc)}") from None
    except RecursionError:
        raise InvalidInput(f"params of {m.name} nest deeper than any method takes") from None
    check_params(m.name, params)
    return params


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


def _error(exc: BaseException) -> RpcError:
    request_log.store_failed(exc)
    if not isinstance(exc, BetterComputeError):
        exc = outage_error(exc) or exc
    if isinstance(exc, BetterComputeError):
        return RpcError(exc.rpc_code, exc.message, {"code": exc.code, **exc.data})
    incident = uuid.uuid4().hex[:12]
    log.error("internal error (incident %s)", incident, exc_info=exc)
    return RpcError(
        -32603,
        f"internal error (incident {incident}): the server logged the details; "
        "report the incident id to the operator",
        {"code": "internal", "incident": incident},
    )


def _unknown_method(name: str) -> RpcError:
    shown = name if len(name) <= 100 else name[:100] + "..."
    close = difflib.get_close_matches(name, list(METHODS), n=3) if len(name) <= 100 else []
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return RpcError(
        -32601,
        f"no method {shown!r}.{hint} `better-compute api rpc.discover` lists every method",
        {"code": "method_not_found"},
    )


def handle(
    body: bytes,
    services: Services,
    authenticate: Callable[[], Principal],
) -> bytes:
    """Answer one JSON-RPC request body (a single request; batches are refused).

    b"" for a notification (a request without ``id``): it runs, unanswered.
    """
    try:
        request = _REQUEST.decode(body)
    except msgspec.DecodeError as exc:
        code = -32700 if "JSON" in str(exc) or "truncated" in str(exc) else -32600
        return parse_error(code, f"not a JSON-RPC 2.0 request object: {_short(exc)}")
    except RecursionError:
        return parse_error(-32700, "the body nests deeper than the server reads: send one flat "
                                   "JSON-RPC 2.0 request object")
    except Exception as exc:  # no decoding failure may become internal
        return parse_error(-32700, f"the body is not JSON ({type(exc).__name__})")
    response = answer(request, services, authenticate)
    request_log.answered(request.method if request.method in METHODS else "unknown",
                         response.error)
    if request.id is msgspec.UNSET and request.jsonrpc == "2.0":
        return b""
    return _ENCODER.encode(response)


# Each ``writes`` method's name as a JSON string.
_WRITES = tuple(f'"{m.name}"'.encode() for m in METHODS.values() if m.writes)


def writes_hint(body: bytes) -> bool:
    """Whether ``body`` names a method that books or frees GPUs (``Method.writes``), read
    before the body is decoded, so that the call can wait for the writers' threads in the
    event loop rather than in a thread. A hint: a name found elsewhere in a body (say, in a
    parameter) only sends that call to the writers' threads, and a name escaped in the JSON
    only to the shared ones; which threads run a call never changes what it does."""
    return any(name in body for name in _WRITES)


def parse_error(code: int, message: str, request_id: int | str | None = None) -> bytes:
    """A JSON-RPC error answer about the request itself (``invalid_request``)."""
    err = RpcError(code, message, {"code": "invalid_request"})
    return _ENCODER.encode(RpcResponse(id=request_id, error=err))


def answer(
    request: RpcRequest, services: Services, authenticate: Callable[[], Principal]
) -> RpcResponse:
    request_id = None if request.id is msgspec.UNSET else request.id
    if request.jsonrpc != "2.0":
        err = RpcError(-32600, 'jsonrpc must be "2.0"', {"code": "invalid_request"})
        return RpcResponse(id=request_id, error=err)
    m = METHODS.get(request.method)
    if m is None:
        return RpcResponse(id=request_id, error=_unknown_method(request.method))
    try:
        principal = authenticate() if not m.public else _maybe(authenticate)
        params = services.names.resolve_params(principal, decode_params(m, request.params))
        # The events this call saves carry who made it: ``principal.actor`` (api/store/actor.py).
        result = m.handler(Call(services, principal), params)  # type: ignore[arg-type]
    except Exception as exc:
        return RpcResponse(id=request_id, error=_error(exc))
    return RpcResponse(id=request_id, result=result)


def _maybe(authenticate: Callable[[], Principal]) -> Principal | None:
    try:
        return authenticate()
    except BetterComputeError:
        return None
