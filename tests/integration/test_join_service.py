"""nodes.join on each backend: the token spent and the node created in one save, or nothing."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import msgspec
import pytest
from cryptography import x509

from better_compute.api import pki
from better_compute.api.runtime import Runtime
from better_compute.api.services.join import JoinService
from better_compute.api.wire.join import HardwareFacts, HardwareGpu
from better_compute.domain.access import LOCAL_OPERATOR
from better_compute.domain.errors import (
    BetterComputeError,
    Expired,
    InvalidInput,
    PermissionDenied,
    Unauthenticated,
)
from tests.join_client import JoinAttempt, hardware, open_response, stored_text
from tests.support import POLICY, initialize, open_runtime


@dataclass
class Plane:
    runtime: Runtime
    joins: JoinService
    pool: str
    site: str
    public: dict[str, str]

    def mint(self, **kw: Any) -> tuple[str, str]:
        args: dict[str, Any] = {"ttl": "2h", "max_uses": 1, "expect_serial": None,
                                "expect_mac": None, "expect_uuid": None, "key": None, **kw}
        doc = self.joins.create(LOCAL_OPERATOR, self.pool, args["ttl"], args["max_uses"],
                                args["expect_serial"], args["expect_mac"], args["expect_uuid"],
                                args["key"])
        return doc["id"], doc["token"]

    def join(self, attempt: JoinAttempt) -> dict[str, str]:
        return self.joins.join(attempt.params(self.public)["sealed"])

    def token(self, token_id: str) -> dict[str, Any]:
        return self.joins.get(LOCAL_OPERATOR, token_id)

    def nodes(self) -> list[dict[str, Any]]:
        return self.runtime.service.listing("node")

    def event_types(self) -> list[str]:
        notes = self.runtime.store.recorder.select_notifications(start=0, limit=10_000)
        return [n.topic for n in notes]


@pytest.fixture
def plane(env: dict[str, str]) -> Iterator[Plane]:
    initialize(env)  # the real init: the master key file the service unseals the PKI with
    runtime = open_runtime(env)
    service = runtime.service
    site = service.sites_create(LOCAL_OPERATOR, "shared", "eu-1", None, "site-eu-1")["id"]
    pool = service.pools_create(LOCAL_OPERATOR, site, "metal-host", "H100", POLICY, None,
                                "pool-eu-1-h100")["id"]
    yield Plane(runtime, runtime.services.join, pool, site, service.pki().public)
    runtime.close()


def test_join_spends_the_token_and_creates_the_node_in_one_save(plane: Plane) -> None:
    token_id, secret = plane.mint(expect_serial="SN-7701")
    attempt = JoinAttempt(secret, hardware(serial="SN-7701"))
    response = open_response(plane.join(attempt), plane.public)

    assert response.nonce == attempt.nonce
    assert (response.site_id, response.pool_id, response.role) == (plane.site, plane.pool, "node")
    assert response.node_id.startswith("node_") and response.tenant_id == "root"
    cert = x509.load_pem_x509_certificate(response.certificate_pem.encode())
    node_ca = x509.load_pem_x509_certificate(plane.public["nodeCaCertificate"].encode())
    cert.verify_directly_issued_by(node_ca)
    assert pki.node_id_from_certificate(cert) == response.node_id
    assert pki.spki_pin(cert.public_key()) == pki.spki_pin(attempt.key.public_key())
    assert cert.not_valid_after_utc - cert.not_valid_before_utc <= timedelta(days=8)

    nodes = plane.nodes()
    assert [n["id"] for n in nodes] == [response.node_id]
    node = nodes[0]
    assert node["provisionState"] == "adopting"
    assert node["hardwareKey"] == "serial:SN-7701"
    assert node["keyPin"] == pki.spki_pin(attempt.key.public_key())
    assert node["certificate"]["serial"] == format(cert.serial_number, "x")
    assert len(node["gpus"]) == 2 and node["hardware"]["serial"] == "SN-7701"
    token = plane.token(token_id)
    assert (token["state"], token["uses"], token["nodeIds"]) == ("exhausted", 1,
                                                                [response.node_id])
    assert plane.event_types()[-3:] == ["joinToken.used", "joinToken.exhausted", "node.joined"]


def _refused(plane: Plane, attempt: JoinAttempt, error: type[BetterComputeError],
             token_id: str | None, *, uses: int = 0) -> BetterComputeError:
    nodes_before = len(plane.nodes())
    with pytest.raises(error) as caught:
        plane.join(attempt)
    assert len(plane.nodes()) == nodes_before
    if token_id is not None:
        assert plane.token(token_id)["uses"] == uses
    return caught.value


def test_wrong_secret_is_unknown(plane: Plane) -> None:
    token_id, secret = plane.mint()
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    err = _refused(plane, JoinAttempt(forged), Unauthenticated, token_id)
    assert "unknown" in err.message
    _refused(plane, JoinAttempt("bcjt_nonsense"), Unauthenticated, token_id)


def test_expired_token_is_refused_and_recorded_once(plane: Plane) -> None:
    token_id, secret = plane.mint(ttl="1m")
    start = plane.runtime.service.clock()
    plane.runtime.service.clock = lambda: start + timedelta(minutes=2)
    err = _refused(plane, JoinAttempt(secret), Expired, token_id)
    assert "join-tokens create" in err.message
    _refused(plane, JoinAttempt(secret), Expired, token_id)
    assert plane.event_types().count("joinToken.expired") == 1
    assert plane.token(token_id)["state"] == "expired"


def test_revoked_token_is_refused(plane: Plane) -> None:
    token_id, secret = plane.mint()
    plane.joins.revoke(LOCAL_OPERATOR, token_id)
    err = _refused(plane, JoinAttempt(secret), PermissionDenied, token_id)
    assert "revoked" in err.message


def test_used_up_token_is_refused(plane: Plane) -> None:
    token_id, secret = plane.mint(max_uses=2)
    plane.join(JoinAttempt(secret, hardware(serial="SN-1")))
    plane.join(JoinAttempt(secret, hardware(serial="SN-2")))
    err = _refused(plane, JoinAttempt(secret, hardware(serial="SN-3")), PermissionDenied,
                   token_id, uses=2)
    assert "used up" in err.message


@pytest.mark.parametrize(("binding", "facts", "needle"), [
    ({"expect_serial": "SN-7701"}, hardware(serial="SN-9999"), "bound to serial SN-7701"),
    ({"expect_mac": "52:54:00:aa:bb:cc"}, hardware(macs=("52:54:00:12:34:56",)),
     "bound to MAC 52:54:00:aa:bb:cc"),
    ({"expect_uuid": "4c4c4544-0000-1000-8000-000000000001"},
     hardware(product_uuid="4c4c4544-0000-1000-8000-000000000002"), "bound to product UUID"),
    ({}, hardware(serial=None, product_uuid=None), "bind the token with --expect-mac"),
])
def test_binding_refusals(plane: Plane, binding: dict[str, str], facts: Any,
                          needle: str) -> None:
    token_id, secret = plane.mint(**binding)
    err = _refused(plane, JoinAttempt(secret, facts), PermissionDenied, token_id)
    assert needle in err.message


def test_a_machine_without_hardware_key_joins_with_a_mac_binding(plane: Plane) -> None:
    _, secret = plane.mint(expect_mac="52-54-00-12-34-56")
    facts = hardware(serial=None, product_uuid=None, macs=("52:54:00:12:34:56",))
    response = open_response(plane.join(JoinAttempt(secret, facts)), plane.public)
    assert plane.nodes()[0]["id"] == response.node_id
    assert plane.nodes()[0]["hardwareKey"] == "mac:52:54:00:12:34:56"


def test_tampered_sealed_request_is_refused(plane: Plane) -> None:
    token_id, secret = plane.mint()
    sealed = bytearray(base64.b64decode(JoinAttempt(secret).params(plane.public)["sealed"]))
    sealed[-1] ^= 1
    with pytest.raises(InvalidInput):
        plane.joins.join(base64.b64encode(bytes(sealed)).decode())
    with pytest.raises(InvalidInput):
        plane.joins.join("not base64!")
    assert plane.token(token_id)["uses"] == 0 and plane.nodes() == []


def test_racing_joins_spend_a_one_use_token_once(plane: Plane) -> None:
    token_id, secret = plane.mint()
    attempts = [JoinAttempt(secret, hardware(serial="SN-7701")) for _ in range(4)]
    params = [a.params(plane.public)["sealed"] for a in attempts]
    results: list[object] = []
    barrier = threading.Barrier(len(params))

    def run(sealed: str) -> None:
        barrier.wait()
        try:
            results.append(plane.joins.join(sealed))
        except BetterComputeError as exc:
            results.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in params]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(isinstance(r, dict) for r in results) == 1, results
    assert len(plane.nodes()) == 1 and plane.token(token_id)["uses"] == 1


def test_the_secret_is_never_stored(plane: Plane) -> None:
    token_id, secret = plane.mint(expect_serial="SN-7701")
    plane.join(JoinAttempt(secret, hardware(serial="SN-7701")))
    plane.joins.list(LOCAL_OPERATOR, None, None)
    text = stored_text(plane.runtime)
    random_part = secret.split(".", 1)[1]
    assert token_id in text  # the scan does see the token's records
    assert secret not in text and random_part not in text


def test_a_join_without_master_key_is_unavailable(plane: Plane) -> None:
    _, secret = plane.mint()
    attempt = JoinAttempt(secret)
    sealed = attempt.params(plane.public)["sealed"]
    plane.runtime.service.master_key_text = None
    with pytest.raises(BetterComputeError, match="master key"):
        plane.joins.join(sealed)
    assert plane.nodes() == []



def test_joined_hardware_says_memory_mib_and_gib_as_everything_else(plane: Plane) -> None:
    """node.joined says `memoryMiB`/`memoryGiB`, as every other document does; an older bcd
    that sends `memoryMib`/`memoryGib` is read."""
    _, secret = plane.mint(expect_serial="SN-7701")
    plane.join(JoinAttempt(secret, hardware(serial="SN-7701")))
    node = plane.nodes()[0]
    assert node["hardware"]["memoryGiB"] == 512.0 and "memoryGib" not in node["hardware"]
    assert node["gpus"][0]["memoryMiB"] == 81559 and "memoryMib" not in node["gpus"][0]

    old = msgspec.json.decode(b'{"uuid": "GPU-1", "name": "H100", "memoryMib": 81559}',
                              type=HardwareGpu)
    assert old.memory_mib == 81559
    facts = msgspec.json.decode(b'{"memoryGib": 512.5}', type=HardwareFacts)
    assert facts.memory_gib == 512.5
    assert b'"memoryMiB":81559' in msgspec.json.encode(old)
    assert b'"memoryMib":null' in msgspec.json.encode(old)  # never the old name with a value
