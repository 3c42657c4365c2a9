"""How the CLI reaches the control plane: HTTP to BETTER_COMPUTE_URL, or in-process.

Both speak the same JSON-RPC methods, so every command behaves the same with
and without a server. Errors come back as the project's own error classes,
rebuilt from their stable code.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol
from urllib.parse import urlparse

from better_compute.api.net import is_loopback
from better_compute.domain.errors import (
    BetterComputeError,
    InvalidInput,
    Unavailable,
    error_from_code,
)


def httpx_module() -> ModuleType:
    """httpx, without its own command line: ``import httpx`` loads ``httpx._main`` (click,
    rich, pygments: about half of httpx's import time) only to offer ``httpx.main``. None in
    sys.modules makes that import fail at once, and httpx falls back to a stub ``main``."""
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    import httpx

    return httpx


class Client(Protocol):
    def call(self, method: str, params: dict[str, Any] | None = None) -> Any: ...
    def close(self) -> None: ...


def _raise_rpc_error(error: dict[str, Any]) -> None:
    data = dict(error.get("data") or {})
    code = str(data.pop("code", "error"))
    raise error_from_code(code, str(error.get("message", "error")), data)


def api_base(url: str) -> str:
    """The API root (…/api/compute) for BETTER_COMPUTE_URL, with or without the path."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InvalidInput(
            f"BETTER_COMPUTE_URL {url!r} is not an http(s) URL: set it to the server, "
            "for example https://compute.example.com"
        )
    if parsed.scheme == "http" and not is_loopback(parsed.hostname):
        raise InvalidInput(
            f"BETTER_COMPUTE_URL {url!r} uses plain http to a non-loopback host; tokens would "
            "cross the network in clear text: use https:// (plain http is allowed only for "
            "loopback addresses such as 127.0.0.1)"
        )
    base = url.rstrip("/")
    if not base.endswith("/api/compute"):
        base += "/api/compute"
    return base


def tls_context(env: Mapping[str, str], *, system_store: bool = True) -> ssl.SSLContext:
    """The system's trust store plus the PEM bundle named by BETTER_COMPUTE_CA_FILE.

    ``system_store=False`` leaves the system's store out (parsing it is most of a context's
    cost): HttpClient tries the named bundle alone first, then both on a verification error.
    """
    ca_file = env.get("BETTER_COMPUTE_CA_FILE")
    if system_store or not ca_file:
        context = ssl.create_default_context()
    else:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies, checks the host name
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(
                f"BETTER_COMPUTE_CA_FILE {ca_file!r} is not a readable PEM bundle ({exc}): point "
                "it at the serving CA certificate `better-compute init` wrote"
            ) from None
    return context


PROBE_TIMEOUT_S = 5.0


def connection_error(base: str, exc: BaseException, closed: bool | None = None
                     ) -> BetterComputeError:
    """What a failed connection to ``base`` (the API root) means for the person who set
    BETTER_COMPUTE_URL: ``invalid_input`` (exit 2: fix the setting, retrying cannot help) when
    the server's certificate is not trusted, when the URL says http:// to a port that speaks
    TLS, or when the port asks for a client certificate (the agents' gateway); otherwise
    ``unavailable`` (exit 11: retry). ``closed``: the server closed or reset the connection
    without an answer (default: read from ``exc``, an http.client or socket error)."""
    if closed is None:
        closed = isinstance(exc, ConnectionError | ssl.SSLError | http_client().HTTPException)
    parsed = urlparse(base)
    host, https = parsed.hostname or "", parsed.scheme == "https"
    port = parsed.port or (443 if https else 80)
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
        return InvalidInput(
            f"{base}: the server's certificate is not trusted ({text}): set "
            "BETTER_COMPUTE_CA_FILE to the serving CA certificate `better-compute init` wrote "
            "(DATA_DIR/serving-ca.pem), or use the host name the server's certificate names "
            "(serve --hostname)")
    if not https and closed and _speaks_tls(host, port):
        return InvalidInput(
            f"{base}: port {port} speaks HTTPS, and the URL says http:// ({text}): set "
            f"BETTER_COMPUTE_URL=https://{parsed.netloc}")
    if https and closed and (
            "CERTIFICATE_REQUIRED" in text.upper() or _asks_for_a_certificate(host, port)):
        return InvalidInput(
            f"{base}: the server asks for a client certificate ({text}): that is the agents' "
            "gateway (mutual TLS, for bcd), not the API: set BETTER_COMPUTE_URL to the API's "
            "address (`serve --listen`; scripts/run serves it on https://localhost:8443)")
    return Unavailable(f"cannot reach {base} ({text})")


def http_client() -> ModuleType:
    import http.client

    return http.client


def _tls_probe(host: str, port: int) -> ssl.SSLSocket | None:
    """A TLS connection to ``host:port`` that trusts anything (only to learn what speaks
    there; nothing is sent on it that a secret could be part of), or None."""
    import socket

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        raw = socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S)
    except OSError:
        return None
    try:
        return context.wrap_socket(raw, server_hostname=host)
    except (OSError, ssl.SSLError):
        raw.close()
        return None


def _speaks_tls(host: str, port: int) -> bool:
    probe = _tls_probe(host, port)
    if probe is None:
        return False
    probe.close()
    return True


def _asks_for_a_certificate(host: str, port: int) -> bool:
    """The TLS handshake completes, and the server then ends the connection (TLS 1.3 sends
    its verdict on the client's certificate after the handshake) instead of answering a
    plain HTTP request: a server that requires a client certificate."""
    probe = _tls_probe(host, port)
    if probe is None:
        return False
    try:
        probe.sendall(b"GET /api/compute/health HTTP/1.1\r\nHost: probe\r\n"
                      b"Connection: close\r\n\r\n")
        answered = probe.recv(16)
    except ssl.SSLError as exc:
        return "CERTIFICATE_REQUIRED" in str(exc).upper() or isinstance(exc, ssl.SSLEOFError)
    except OSError:
        return False
    finally:
        probe.close()
    return not answered


class HttpClient:
    """JSON-RPC over HTTPS with the standard library's http.client: one kept-alive connection,
    reopened when it idled past the server's keep-alive. Not httpx: a command line pays its
    imports on every run, and httpx's (with httpcore and h11) cost more than the call itself
    (docs/performance.md, "Start-up of the command lines"). ``events watch`` streams with httpx (StreamClient)."""

    IDLE_REOPEN_S = 4.0  # under uvicorn's 5 s keep-alive: never send on a socket it closed

    def __init__(self, url: str, token: str | None, env: Mapping[str, str],
                 timeout: float = 60.0) -> None:
        self.base = api_base(url)
        parsed = urlparse(self.base)
        self._https = parsed.scheme == "https"
        self._host, self._port, self._path = parsed.hostname or "", parsed.port, parsed.path
        self._env = env
        # The named CA alone first: the system's store only if the server's chain needs it.
        self._context = tls_context(env, system_store=False) if self._https else None
        self._system_store = not env.get("BETTER_COMPUTE_CA_FILE")
        self._headers = {"user-agent": "better-compute-cli", "content-type": "application/json",
                         "accept": "application/json"}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._timeout = timeout
        self._conn: Any = None
        self._used = 0.0
        self._next_id = 0

    def _connection(self) -> Any:
        import http.client

        if self._conn is not None and time.monotonic() - self._used > self.IDLE_REOPEN_S:
            self.close()
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout, context=self._context)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self._timeout)
        return self._conn

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        import http.client

        self._next_id += 1
        body = json.dumps({"jsonrpc": "2.0", "id": self._next_id, "method": method,
                           "params": params or {}}, separators=(",", ":"))
        try:
            try:
                conn = self._connection()
                conn.request("POST", self._path + "/rpc", body=body.encode(),
                             headers=self._headers)
            except ssl.SSLCertVerificationError:
                if self._system_store:
                    raise
                # Not signed by the named CA: the handshake failed before anything was sent,
                # so trying again with the system's store as well is safe.
                self.close()
                self._context, self._system_store = tls_context(self._env), True
                conn = self._connection()
                conn.request("POST", self._path + "/rpc", body=body.encode(),
                             headers=self._headers)
            response = conn.getresponse()
            content = response.read()
            self._used = time.monotonic()
            if response.will_close:
                self.close()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise connection_error(self.base, exc) from None
        try:
            answer = json.loads(content)
            if not isinstance(answer, dict):
                raise ValueError("not an object")
        except ValueError:
            raise Unavailable(
                f"{self.base}/rpc answered HTTP {response.status} without JSON-RPC: is "
                "BETTER_COMPUTE_URL the better-compute API?"
            ) from None
        if answer.get("error"):
            _raise_rpc_error(answer["error"])
        return answer.get("result")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class StreamClient:
    """An httpx client for the long-lived /events/watch stream (start-up does not matter)."""

    def __init__(self, url: str, token: str | None, env: Mapping[str, str],
                 timeout: float) -> None:
        self.base = api_base(url)
        headers = {"user-agent": "better-compute-cli"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        verify: ssl.SSLContext | bool = tls_context(env) if self.base.startswith("https") else False
        self.http = httpx_module().Client(base_url=self.base, headers=headers, verify=verify,
                                          timeout=timeout)

    def close(self) -> None:
        self.http.close()


class LocalClient:
    """In-process calls on the local store (no server); same methods, same checks."""

    def __init__(self, env: Mapping[str, str], token: str | None) -> None:
        from better_compute.api.runtime import Runtime

        self.runtime = Runtime.open(env)
        self.token = token
        self._initialized = False

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        import msgspec

        from better_compute.api.http import rpc
        from better_compute.api.http.schemas import RpcRequest
        from better_compute.domain.access import LOCAL_OPERATOR

        service = self.runtime.service
        if not self._initialized:  # every method, on a store `init` never ran on: not_initialized
            service.pki()
            self._initialized = True

        def authenticate() -> Any:
            # Whoever can open the store's files is its operator; a token, when set, narrows that.
            return service.authenticate(self.token) if self.token else LOCAL_OPERATOR

        request = RpcRequest(method=method, params=msgspec.Raw(msgspec.json.encode(params or {})))
        answer = rpc.answer(request, self.runtime.services, authenticate)
        if answer.error is not msgspec.UNSET:
            _raise_rpc_error(msgspec.to_builtins(answer.error))
        return msgspec.to_builtins(answer.result)

    def close(self) -> None:
        self.runtime.close()


def make_client(env: Mapping[str, str]) -> Client:
    url = env.get("BETTER_COMPUTE_URL", "").strip()
    token = env.get("BETTER_COMPUTE_TOKEN", "").strip() or None
    if url:
        return HttpClient(url, token, env)
    return LocalClient(env, token)
