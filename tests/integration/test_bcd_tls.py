"""bcd's pinned TLS against a real HTTPS server on loopback.

The server is a small stdlib HTTPS server playing the control plane (tests/
bcd_fake_control_plane.py behind it), so each test can choose which CA signs the
server's certificate independently of the document it serves: the impostor case.
"""

from __future__ import annotations

import contextlib
import io
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import msgspec
import pytest

from better_compute.agent.control_plane import HttpControlPlane
from better_compute.agent.errors import BcdError
from better_compute.agent.gpu import write_fake_fleet_file
from better_compute.agent.join import JoinOptions, join
from better_compute.agent.paths import Paths
from better_compute.api import pki
from better_compute.api.wire.join import JoinParams
from tests.bcd_fake_control_plane import NODE_ID, TOKEN, FakeControlPlane, well_known_of


class _Handler(BaseHTTPRequestHandler):
    plane: FakeControlPlane
    posts: list[str]

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path != "/api/compute/.well-known/better-compute":
            self._send(404, b"{}")
            return
        self._send(200, msgspec.json.encode(well_known_of(self.plane.bundle)))

    def do_POST(self) -> None:
        self.posts.append(self.path)
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        try:
            result = self.plane.join(msgspec.convert(request["params"], JoinParams))
            answer = {"jsonrpc": "2.0", "id": request["id"], "result": msgspec.to_builtins(result)}
        except BcdError as exc:
            answer = {"jsonrpc": "2.0", "id": request["id"], "error": {
                "code": -32001, "message": exc.message, "data": {"code": exc.code}}}
        self._send(200, json.dumps(answer).encode())


@contextlib.contextmanager
def https_server(plane: FakeControlPlane, signer: pki.PkiBundle, tmp: Path) -> Iterator[tuple[str, list[str]]]:
    """Serve ``plane``'s document with a TLS certificate issued by ``signer``'s serving CA."""
    cert, key = pki.issue_serving_certificate(signer, ["127.0.0.1", "localhost"])
    (tmp / "tls.crt").write_bytes(cert)
    (tmp / "tls.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
    posts: list[str] = []
    handler = type("Handler", (_Handler,), {"plane": plane, "posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/api/compute", posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


Machine = tuple[Paths, dict[str, str]]  # the machine fixture: its Paths and its environment


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    write_fake_fleet_file(tmp_path / "gpus.json", serial="SN-7701")
    env = {"BCD_ROOT": str(tmp_path / "root"), "BCD_GPU_SOURCE": f"fake:{tmp_path / 'gpus.json'}",
           "BCD_JOIN_TOKEN": TOKEN}
    return Paths.from_env(env), env


def _join(url: str, plane: FakeControlPlane, machine: Machine, **pins: str) -> str:
    paths, env = machine
    out = io.StringIO()
    opts = JoinOptions(server=url, **{**plane.pins(), **pins})
    join(opts, paths=paths, env=env, stdin=None, out=out)
    return out.getvalue()


def test_join_over_pinned_tls(machine: Machine, tmp_path: Path) -> None:
    plane = FakeControlPlane()
    with https_server(plane, plane.bundle, tmp_path) as (url, posts):
        out = _join(url + "/", plane, machine)
    assert out.startswith(f"joined as {NODE_ID}")
    assert posts == ["/api/compute/rpc"]
    assert machine[0].config.exists()


def test_a_wrong_serving_ca_pin_is_refused_before_any_post(machine: Machine,
                                                           tmp_path: Path) -> None:
    plane = FakeControlPlane()
    other_pin = FakeControlPlane(bundle=pki.generate_bundle()).pins()["serving_ca_pin"]
    with https_server(plane, plane.bundle, tmp_path) as (url, posts), \
            pytest.raises(BcdError, match="not the --serving-ca-pin"):
        _join(url, plane, machine, serving_ca_pin=other_pin)
    assert posts == [] and not machine[0].etc.exists()


def test_an_impostor_serving_the_genuine_document_is_refused(machine: Machine,
                                                             tmp_path: Path) -> None:
    """The document (CA certificate, pins) is copied, but the TLS key is the impostor's."""
    plane = FakeControlPlane()
    impostor = pki.generate_bundle()
    with https_server(plane, impostor, tmp_path) as (url, posts), \
            pytest.raises(BcdError, match="not issued by the pinned serving CA"):
        _join(url, plane, machine)
    assert posts == [] and not machine[0].etc.exists()


def test_the_control_planes_json_rpc_error_message_is_shown(machine: Machine,
                                                            tmp_path: Path) -> None:
    plane = FakeControlPlane(token="bcjt_someone-else")
    with https_server(plane, plane.bundle, tmp_path) as (url, _), \
            pytest.raises(BcdError, match="the join token is not valid") as refused:
        _join(url, plane, machine)
    assert refused.value.code == "unauthenticated"
    assert not machine[0].etc.exists()


def test_join_needs_the_pinned_context_first() -> None:
    with pytest.raises(RuntimeError):
        HttpControlPlane("https://127.0.0.1:1/api/compute").join(JoinParams(sealed="x"))
