"""A join through a real `serve` over TLS: the secret leaves no trace in the logs or the store."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import httpx

from better_compute.api.wire.join import HardwareFacts
from tests.join_client import JoinAttempt, hardware, open_response, stored_text
from tests.support import POLICY, cli_inprocess, client_env, initialize, open_runtime, serve

GATEWAY = "https://gw.eu-1.example.com:8443"


def test_join_over_tls_and_the_secret_is_nowhere(env: dict[str, str], tmp_path: Path) -> None:
    root_token = initialize(env)
    (tmp_path / "pool-policy.json").write_text(json.dumps(POLICY))
    with serve(env, "--gateway-url", GATEWAY, "--log-level", "debug") as server:
        operator = client_env(env, server, root_token)
        code, site, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region",
                                         "eu-1", "--query", "id"], operator)
        assert code == 0, err
        code, pool, err = cli_inprocess(
            ["pools", "create", "--site", site.strip(), "--class", "metal-host", "--gpu-model",
             "H100", "--policy-file", str(tmp_path / "pool-policy.json"), "--query", "id"],
            operator)
        assert code == 0, err
        code, out, err = cli_inprocess(
            ["join-tokens", "create", "--pool", pool.strip(), "--ttl", "2h", "--max-uses", "1",
             "--expect-serial", "SN-7701", "--key", "join-sn-7701", "--out",
             str(tmp_path / "join-token")], operator)
        assert code == 0, err
        token_id = json.loads(out)["id"]
        secret = (tmp_path / "join-token").read_text().strip()

        context = ssl.create_default_context(cafile=operator["BETTER_COMPUTE_CA_FILE"])
        with httpx.Client(base_url=server.url + "/api/compute", verify=context) as http:
            known = http.get("/.well-known/better-compute").json()  # no token needed
            assert known["gatewayUrl"] == GATEWAY
            public = {"joinEncryptionPublicKey": known["joinEncryptionPublicKey"],
                      "joinSigningPublicKey": known["joinSigningPublicKey"]}

            def join(facts: HardwareFacts) -> Any:  # the JSON-RPC answer, as parsed
                body = {"jsonrpc": "2.0", "id": 1, "method": "nodes.join",
                        "params": JoinAttempt(secret, facts).params(public)}
                return http.post("/rpc", json=body).json()

            refused = join(hardware(serial="SN-0000"))
            assert refused["error"]["data"]["code"] == "permission_denied"
            response = open_response(join(hardware(serial="SN-7701"))["result"], public)
            assert response.gateway_url == GATEWAY
            spent = join(hardware(serial="SN-7701"))
            assert "used up" in spent["error"]["message"]

        code, out, _ = cli_inprocess(["join-tokens", "get", token_id, "--query", "nodeIds"],
                                     operator)
        assert json.loads(out) == [response.node_id]
    assert server.process.stderr is not None
    logs = server.process.stderr.read()
    assert logs.strip(), "the server logged nothing at debug level: the scan would prove nothing"
    random_part = secret.split(".", 1)[1]
    assert secret not in logs and random_part not in logs

    runtime = open_runtime(env)
    try:
        text = stored_text(runtime)
    finally:
        runtime.close()
    assert response.node_id in text and token_id in text
    assert secret not in text and random_part not in text
