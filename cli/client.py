"""How the CLI reaches the control plane: HTTP to BETTER_COMPUTE_URL, or in-process.

Both speak the same JSON-RPC methods, so every command behaves the same with
and without a server. Errors come back as the project's own error classes,
rebuilt from their stable code.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import urlparse

import httpx
import msgspec

from better_compute.api.net import is_loopback
from better_compute.domain.errors import InvalidInput, Unavailable, error_from_code


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


def tls_context(env: Mapping[str, str]) -> ssl.SSLContext:
    """The system's trust store plus the PEM bundle named by BETTER_COMPUTE_CA_FILE."""
    context = ssl.create_default_context()
    ca_file = env.get("BETTER_COMPUTE_CA_FILE")
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise InvalidInput(
                f"BETTER_COMPUTE_CA_FILE {ca_file!r} is not a readable PEM bundle ({exc}): point "
                "it at the serving CA certificate `better-compute init` wrote"
            ) from None
    return context


class HttpClient:
    def __init__(self, url: str, token: str | None, env: Mapping[str, str],
                 timeout: float = 60.0) -> None:
        self.base = api_base(url)
        headers = {"user-agent": "better-compute-cli"}
        if token:
            headers["authorization"] = f"Bearer {token}"
        verify: ssl.SSLContext | bool = tls_context(env) if self.base.startswith("https") else False
        self.http = httpx.Client(base_url=self.base, headers=headers, verify=verify,
                                 timeout=timeout)
        self._next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        self._next_id += 1
        body = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}}
        try:
            response = self.http.post("/rpc", content=msgspec.json.encode(body),
                                      headers={"content-type": "application/json"})
        except httpx.ConnectError as exc:
            hint = ""
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):
                hint = (": the server's certificate is not trusted; set BETTER_COMPUTE_CA_FILE "
                        "to the serving CA certificate `better-compute init` wrote")
            raise Unavailable(f"cannot reach {self.base} ({exc}){hint}") from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"request to {self.base} failed: {exc}") from None
        try:
            answer = msgspec.json.decode(response.content)
        except msgspec.DecodeError:
            raise Unavailable(
                f"{self.base}/rpc answered HTTP {response.status_code} without JSON-RPC: is "
                "BETTER_COMPUTE_URL the better-compute API?"
            ) from None
        if answer.get("error"):
            _raise_rpc_error(answer["error"])
        return answer.get("result")

    def close(self) -> None:
        self.http.close()


class LocalClient:
    """In-process calls on the local store (no server); same methods, same checks."""

    def __init__(self, env: Mapping[str, str], token: str | None) -> None:
        import better_compute.api.methods  # noqa: F401  (registers methods)
        from better_compute.api.runtime import Runtime

        self.runtime = Runtime.open(env)
        self.token = token

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        from better_compute.api import rpc
        from better_compute.api.schemas import RpcRequest
        from better_compute.domain.access import LOCAL_OPERATOR

        service = self.runtime.service

        def authenticate() -> Any:
            # Whoever can open the store's files is its operator; a token, when set, narrows that.
            return service.authenticate(self.token) if self.token else LOCAL_OPERATOR

        request = RpcRequest(method=method, params=msgspec.Raw(msgspec.json.encode(params or {})))
        answer = rpc.answer(request, service, authenticate)
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
