"""Public routes a joining machine reads: the well-known document and bcd downloads.

``GET /api/compute/.well-known/better-compute`` publishes the gateway URL, the
three pins and the public keys they pin (no token needed: pins are public, and
bcd checks them against the ones its operator gave it).

``GET /api/compute/downloads/{name}`` serves files from
BETTER_COMPUTE_DOWNLOADS_DIR, only under goreleaser's names
``bcd_<version>_linux_<amd64|arm64>``; anything else is 404, and a name can
never leave that folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from better_compute.api.store.outage import unavailable_on_outage
from better_compute.api.wire.join import WellKnown
from better_compute.domain.errors import BetterComputeError

PREFIX = "/api/compute"
DOWNLOAD_NAME_RE = re.compile(r"^bcd_[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}_linux_(amd64|arm64)\Z")


def well_known_document(public: dict[str, str], api_url: str | None,
                        gateway_url: str | None) -> WellKnown:
    return WellKnown(
        api_url=api_url,
        gateway_url=gateway_url,
        serving_ca_spki_pin=public["servingCaSpkiPin"],
        join_signing_key_pin=public["joinSigningKeyPin"],
        join_encryption_key_pin=public["joinEncryptionKeyPin"],
        serving_ca_certificate=public["servingCaCertificate"],
        join_signing_public_key=public["joinSigningPublicKey"],
        join_encryption_public_key=public["joinEncryptionPublicKey"],
    )


def _error(status: int, exc: BetterComputeError) -> JSONResponse:
    return JSONResponse({"error": {"code": exc.code, "message": exc.message}}, status_code=status)


async def well_known(request: Request) -> Response:
    state: Any = request.app.state.bc
    try:
        with unavailable_on_outage():
            stored = await anyio.to_thread.run_sync(state.runtime.service.pki,
                                                    limiter=state.limiter)
    except BetterComputeError as exc:
        return _error(503, exc)
    api_url = str(request.base_url).rstrip("/") + PREFIX
    document = well_known_document(stored.public, api_url, state.gateway_url)
    return Response(msgspec.json.encode(document), media_type="application/json",
                    headers={"cache-control": "no-store"})


def download_path(downloads_dir: str | None, name: str) -> Path | None:
    """The file ``name`` names in the downloads folder, or None (never outside it)."""
    if not downloads_dir or not DOWNLOAD_NAME_RE.match(name):
        return None
    root = Path(downloads_dir).resolve()
    path = (root / name).resolve()
    if path.parent != root or not path.is_file():
        return None
    return path


async def download(request: Request) -> Response:
    state: Any = request.app.state.bc
    name = request.path_params["name"]
    path = download_path(state.runtime.env.get("BETTER_COMPUTE_DOWNLOADS_DIR"), name)
    if path is None:
        return JSONResponse(
            {"error": {"code": "not_found", "message": (
                f"no download {name!r}: downloads are bcd_<version>_linux_<amd64|arm64> files "
                "in the server's BETTER_COMPUTE_DOWNLOADS_DIR")}},
            status_code=404,
        )
    return FileResponse(path, media_type="application/octet-stream", filename=name)


ROUTES = [
    Route(f"{PREFIX}/.well-known/better-compute", well_known, methods=["GET"]),
    Route(f"{PREFIX}/downloads/{{name}}", download, methods=["GET"]),
]
