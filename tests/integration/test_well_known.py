"""The public routes a joining machine reads, on the ASGI app: well-known, downloads, nodes.join."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from better_compute.api.http.app import ServerState, build_app
from better_compute.api.http.join_routes import download_path
from better_compute.api.runtime import Runtime
from better_compute.api.wire.join import WellKnown
from better_compute.domain.access import LOCAL_OPERATOR
from tests.join_client import JoinAttempt, open_response
from tests.support import POLICY, initialize, open_runtime

GATEWAY = "https://gw.eu-1.example.com:8443"


@pytest.fixture
def downloads(tmp_path: Path) -> Path:
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / "bcd_0.1.0_linux_amd64").write_bytes(b"#!/bin/sh\necho stub bcd\n")
    (folder / "notes.txt").write_text("not a download")
    (tmp_path / "bcd_0.1.0_linux_arm64").write_text("outside the folder")
    (folder / "bcd_0.2.0_linux_arm64").symlink_to(tmp_path / "bcd_0.1.0_linux_arm64")
    return folder


class Client:
    """Requests to the ASGI app in this process, with the state its lifespan would set."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.app = build_app(runtime, gateway_url=GATEWAY)

    def request(self, method: str, path: str, **kw: object) -> httpx.Response:
        async def go() -> httpx.Response:
            self.app.state.bc = ServerState(self.runtime, anyio.CapacityLimiter(4), GATEWAY)
            self.runtime.service.gateway_url = GATEWAY
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport,
                                         base_url="https://compute.test") as c:
                return await c.request(method, path, **kw)  # type: ignore[arg-type]

        return anyio.run(go)

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)

    def post(self, path: str, json: object) -> httpx.Response:
        return self.request("POST", path, json=json)


@pytest.fixture
def client(env: dict[str, str], downloads: Path) -> Iterator[Client]:
    initialize(env)
    runtime = open_runtime({**env, "BETTER_COMPUTE_DOWNLOADS_DIR": str(downloads)})
    yield Client(runtime)
    runtime.close()


def test_well_known_publishes_gateway_and_pins_without_a_token(client: Client) -> None:
    response = client.get("/api/compute/.well-known/better-compute")
    assert response.status_code == 200
    doc = msgspec.json.decode(response.content, type=WellKnown)
    pki = client.app.state.bc.runtime.service.pki().public
    assert doc.gateway_url == GATEWAY
    assert doc.api_url == "https://compute.test/api/compute"
    assert (doc.serving_ca_spki_pin, doc.join_signing_key_pin, doc.join_encryption_key_pin) == (
        pki["servingCaSpkiPin"], pki["joinSigningKeyPin"], pki["joinEncryptionKeyPin"])
    assert doc.serving_ca_certificate == pki["servingCaCertificate"]
    assert doc.join_encryption_public_key == pki["joinEncryptionPublicKey"]
    assert set(response.json()) >= {"gatewayUrl", "servingCaSpkiPin", "joinSigningKeyPin",
                                    "joinEncryptionKeyPin"}


def test_downloads_serve_only_bcd_files_from_the_folder(client: Client) -> None:
    ok = client.get("/api/compute/downloads/bcd_0.1.0_linux_amd64")
    assert ok.status_code == 200 and ok.content == b"#!/bin/sh\necho stub bcd\n"
    assert ok.headers["content-type"] == "application/octet-stream"
    for name in ("notes.txt", "bcd_0.1.0_linux_riscv64", "bcd_9.9.9_linux_amd64",
                 "bcd_0.2.0_linux_arm64", "..%2Fbcd_0.1.0_linux_arm64", "bcd_..%2F.._linux_amd64"):
        response = client.get(f"/api/compute/downloads/{name}")
        assert response.status_code == 404, name
        assert b"outside" not in response.content


def test_download_path_never_leaves_the_folder(downloads: Path) -> None:
    assert download_path(None, "bcd_0.1.0_linux_amd64") is None
    assert download_path(str(downloads), "bcd_0.1.0_linux_amd64") == (
        downloads / "bcd_0.1.0_linux_amd64").resolve()
    for name in ("../bcd_0.1.0_linux_arm64", "bcd_0.2.0_linux_arm64", "bcd_/x_linux_amd64",
                 "bcd_.._linux_amd64"):
        assert download_path(str(downloads), name) is None, name
    assert os.path.islink(downloads / "bcd_0.2.0_linux_arm64")


def test_nodes_join_is_public_over_http(client: Client) -> None:
    service = client.runtime.service
    site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, None)["id"]
    pool = service.pools_create(LOCAL_OPERATOR, site, "metal-host", "H100", POLICY, None,
                                None)["id"]
    secret = client.runtime.services.join.create(LOCAL_OPERATOR, pool, "1h", 1, None, None,
                                                 None, None)["token"]
    public = service.pki().public
    body = {"jsonrpc": "2.0", "id": 1, "method": "nodes.join",
            "params": JoinAttempt(secret).params(public)}
    answer = client.post("/api/compute/rpc", json=body).json()
    response = open_response(answer["result"], public)
    assert response.gateway_url == GATEWAY and response.pool_id == pool
    again = client.post("/api/compute/rpc", json=body).json()
    assert again["error"]["data"]["code"] == "permission_denied"
    assert "used up" in again["error"]["message"]
