"""A node made by hand against a real ``serve``: joined over HTTPS as ``bcd join`` does, with
a node key made here (so a valid node certificate), then a session with the gateway spoken
by ``tests/gateway_client.py``'s ``NodeClient``: what a hostile machine with a join token can
do."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
from cryptography.hazmat.primitives.asymmetric import ec

from better_compute.api.wire.join import HardwareFacts
from tests.cluster import Cluster
from tests.gateway_client import NodeClient, write_identity
from tests.join_client import JoinAttempt, hardware, open_response


def join_by_hand(c: Cluster, serial: str, tmp: Path, facts: HardwareFacts | None = None
                 ) -> tuple[NodeClient, str]:
    """Node ``serial`` joined over HTTPS as bcd join does, with a key made here; its client
    for the gateway of ``c``'s server, and its id."""
    c.cli("join-tokens", "create", "--pool", c.pool, "--ttl", "2h", "--max-uses", "1",
          "--expect-serial", serial, "--out", str(tmp / f"token-{serial}"))
    secret = (tmp / f"token-{serial}").read_text().strip()
    context = ssl.create_default_context(cafile=c.env["BETTER_COMPUTE_CA_FILE"])
    attempt = JoinAttempt(secret, facts or hardware(serial=serial, gpus=8),
                          key=ec.generate_private_key(ec.SECP256R1()))
    with httpx.Client(base_url=c.server.url + "/api/compute", verify=context) as http:
        known = http.get("/.well-known/better-compute").json()
        answer = http.post("/rpc", json={"jsonrpc": "2.0", "id": 1, "method": "nodes.join",
                                         "params": attempt.params(known)}).json()
    response = open_response(answer["result"], known)
    joined = write_identity(tmp, response.node_id, attempt.key, response.certificate_pem)
    context = ssl.create_default_context(cafile=c.env["BETTER_COMPUTE_CA_FILE"])
    context.load_cert_chain(joined.cert_path, joined.key_path)
    port = int(known["gatewayUrl"].rsplit(":", 1)[1])
    return NodeClient(None, joined, port=port, context=context), response.node_id
