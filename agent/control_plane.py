"""bcd's HTTP calls to the control plane during a join: the well-known document and nodes.join.

Trust starts from a pin, not from the system's CA store: the well-known document
is first read without verification only to learn the serving CA certificate it
carries; once that certificate's SPKI pin equals the operator's
``--serving-ca-pin``, the document is read again over a connection verified
against exactly that CA (and nothing else), and only that second copy is used.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import msgspec
from cryptography import x509

from better_compute.api.wire.join import JoinParams, SignedJoinResponse, WellKnown
from better_compute.api.wire.sealing import spki_pin

from .errors import BcdError

WELL_KNOWN_PATH = "/.well-known/better-compute"
TIMEOUT = httpx.Timeout(30.0, connect=10.0)


def normalize_server(url: str) -> str:
    """The API root without a trailing slash; only https is accepted."""
    parts = urlsplit(url.strip())
    if parts.scheme != "https" or not parts.netloc:
        raise BcdError(
            f"--server {url!r} is not an https URL: give the control plane's API root, "
            "for example https://compute.example.com/api/compute", code="invalid_input"
        )
    return url.strip().rstrip("/")


def ca_pin(certificate_pem: str) -> str:
    try:
        cert = x509.load_pem_x509_certificate(certificate_pem.encode())
    except ValueError:
        raise BcdError(
            "the well-known document's servingCaCertificate is not a PEM certificate"
        ) from None
    return spki_pin(cert.public_key())


@dataclass(frozen=True)
class Fetched:
    document: WellKnown
    date: datetime | None  # the server's HTTP Date header, for the clock check


class ControlPlane(Protocol):
    """What a join needs from the control plane (tests put a fake in its place)."""

    def well_known(self, serving_ca_pin: str) -> WellKnown: ...

    def join(self, params: JoinParams) -> SignedJoinResponse: ...


def _unverified() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def pinned_context(serving_ca_pem: str) -> ssl.SSLContext:
    """TLS that trusts exactly one CA, the pinned serving CA (not the system's store)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=serving_ca_pem)
    return context


def _decode_well_known(url: str, response: httpx.Response) -> WellKnown:
    if response.status_code != 200:
        raise BcdError(
            f"GET {url} answered HTTP {response.status_code}: check --server (the API root, "
            "ending in /api/compute) and that this control plane serves the well-known document",
            code="unavailable" if response.status_code >= 500 else "invalid_input")
    try:
        return msgspec.json.decode(response.content, type=WellKnown)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BcdError(f"GET {url} did not answer a well-known document: {exc}") from None


def _date(response: httpx.Response) -> datetime | None:
    header = response.headers.get("date")
    if not header:
        return None
    try:
        return parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None


def _get(url: str, verify: ssl.SSLContext) -> httpx.Response:
    try:
        with httpx.Client(verify=verify, timeout=TIMEOUT) as client:
            return client.get(url)
    except httpx.ConnectError as exc:
        if isinstance(exc.__cause__, ssl.SSLCertVerificationError) or "CERTIFICATE" in str(exc):
            raise BcdError(
                f"the TLS certificate of {url} is not issued by the pinned serving CA: another "
                "server answered, or the control plane's serving certificate is not from its PKI",
                code="invalid_input") from None
        raise BcdError(f"cannot reach {url}: {exc}; check --server and the network",
                       code="unavailable") from None
    except httpx.HTTPError as exc:
        raise BcdError(f"cannot reach {url}: {exc}; check --server and the network",
                       code="unavailable") from None


def fetch_unverified(server: str) -> Fetched:
    """The document as anyone on the path could serve it: for its CA certificate and Date."""
    url = server + WELL_KNOWN_PATH
    response = _get(url, _unverified())
    return Fetched(_decode_well_known(url, response), _date(response))


class HttpControlPlane:
    """The control plane over HTTPS, trusting only the pinned serving CA."""

    def __init__(self, server: str) -> None:
        self.server = normalize_server(server)
        self._context: ssl.SSLContext | None = None

    def well_known(self, serving_ca_pin: str) -> WellKnown:
        first = fetch_unverified(self.server).document
        published = ca_pin(first.serving_ca_certificate)
        if published != serving_ca_pin:
            raise BcdError(
                f"the serving CA at {self.server} has pin {published}, not the "
                f"--serving-ca-pin {serving_ca_pin} you gave: refusing to join. Check the pin with "
                "`better-compute pki show --query servingCaSpkiPin` on the control plane",
                code="invalid_input")
        self._context = pinned_context(first.serving_ca_certificate)
        url = self.server + WELL_KNOWN_PATH
        return _decode_well_known(url, _get(url, self._context))

    def join(self, params: JoinParams) -> SignedJoinResponse:
        if self._context is None:
            raise RuntimeError("well_known() establishes the pinned TLS context first")
        url = self.server + "/rpc"
        body = {"jsonrpc": "2.0", "id": 1, "method": "nodes.join",
                "params": msgspec.to_builtins(params)}
        try:
            with httpx.Client(verify=self._context, timeout=TIMEOUT) as client:
                response = client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise BcdError(f"cannot reach {url}: {exc}; nothing was written, run bcd join "
                           "again once the control plane is reachable", code="unavailable") from None
        return _rpc_result(url, response)


def _rpc_result(url: str, response: httpx.Response) -> SignedJoinResponse:
    try:
        answer: Any = json.loads(response.content)
    except ValueError:
        raise BcdError(f"POST {url} answered HTTP {response.status_code}, not JSON-RPC",
                       code="unavailable") from None
    if not isinstance(answer, dict):
        raise BcdError(f"POST {url} answered something other than a JSON-RPC response")
    error = answer.get("error")
    if isinstance(error, dict):
        data: dict[str, Any] = error["data"] if isinstance(error.get("data"), dict) else {}
        message = str(error.get("message") or "the control plane refused the join")
        raise BcdError(message, code=str(data.get("code")) if data.get("code") else None)
    try:
        return msgspec.convert(answer.get("result"), SignedJoinResponse)
    except msgspec.ValidationError as exc:
        raise BcdError(f"nodes.join answered an unexpected result: {exc}") from None
