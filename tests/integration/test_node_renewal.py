"""Node certificates are renewed over the session, for the same node key, on each backend.

The control plane and its gateway run in-process on a fake clock (tests/gateway_client.py);
the node is either a client that speaks the wire (the gateway's rules) or the real bcd
agent (NodeAgent) under a BCD root, whose clock the test moves too. Every wait is on a
condition with a deadline.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import NameOID

from better_compute.agent import config as agent_config
from better_compute.agent.gpu import FakeSource, write_fake_fleet_file
from better_compute.agent.node.agent import NodeAgent, NodeOptions
from better_compute.agent.node.backoff import Backoff
from better_compute.agent.node.devices import unsupported
from better_compute.agent.node.settings import load_settings
from better_compute.agent.paths import Paths
from better_compute.api import pki
from better_compute.api.wire import gateway as wire
from better_compute.domain.access import LOCAL_OPERATOR
from tests.gateway_client import (
    JoinedNode,
    NodeClient,
    Plane,
    run_with_gateway,
)

DAY = 24 * 3600.0




def csr_for(key: Any, name: str = "bcd") -> str:
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM).decode()


async def renew(client: NodeClient, csr_pem: str, epoch: int | None = None) -> wire.ToNode:
    await client.send(wire.Renew(epoch=client.epoch if epoch is None else epoch,
                                 csr_pem=csr_pem))
    with anyio.fail_after(10):
        while True:
            message = await client.receive()
            if isinstance(message, wire.Renewed | wire.Refused):
                return message


def spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def test_the_gateway_renews_for_the_same_key_only(env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        # Joined five days ago (by the fake clock), so both certificates are valid by the
        # real clock that TLS checks.
        plane.clock.advance(-5 * DAY)
        node = plane.join()
        client = NodeClient(plane, node)
        assert isinstance(await client.connect(), wire.Welcome)
        joined = plane.node(node.node_id)["certificate"]

        early = await renew(client, csr_for(node.key))  # 7 days left: not yet
        assert isinstance(early, wire.Refused) and early.code == "renew_too_soon"

        plane.clock.advance(5 * DAY)  # 2 days of 7 left: less than a third
        other_key = ec.generate_private_key(ec.SECP256R1())
        wrong = await renew(client, csr_for(other_key))
        assert isinstance(wrong, wire.Refused) and wrong.code == "renew_wrong_key"
        assert "joined with" in wrong.message and "join afresh" in wrong.message
        garbage = await renew(client, "-----BEGIN CERTIFICATE REQUEST-----\nnope\n")
        assert isinstance(garbage, wire.Refused) and garbage.code == "renew_bad_csr"
        # Refusals record nothing and leave the session up.
        assert plane.event_types(node.node_id) == ["node.joined", "node.connected"]
        assert plane.node(node.node_id)["certificate"] == joined
        assert plane.node(node.node_id)["session"]["state"] == "connected"

        renewed = await renew(client, csr_for(node.key, name="anything-bcd-likes"))
        assert isinstance(renewed, wire.Renewed)
        cert = x509.load_pem_x509_certificate(renewed.certificate_pem.encode())
        assert spki(cert.public_key()) == spki(node.key.public_key())
        assert pki.node_id_from_certificate(cert) == node.node_id  # never the CSR's names
        cert.verify_directly_issued_by(plane.bundle.node_ca_cert)
        assert cert.not_valid_after_utc == plane.clock.now.replace(microsecond=0) + \
            timedelta(days=7)
        serial = format(cert.serial_number, "x")
        doc = plane.node(node.node_id)
        assert doc["certificate"]["serial"] == serial != joined["serial"]
        assert doc["certificate"]["notAfter"] == renewed.not_after
        event = plane.nodes.events(LOCAL_OPERATOR, node.node_id)[-1]
        assert event["type"] == "node.certificate.renewed"
        assert (event["data"]["serial"], event["data"]["notAfter"]) == (serial, renewed.not_after)

        # The renewed certificate opens the next session.
        fresh = plane.write_identity(node.node_id, node.key, renewed.certificate_pem)
        second = NodeClient(plane, fresh)
        welcome = await second.connect()
        assert isinstance(welcome, wire.Welcome) and welcome.epoch == 2
        assert await client.closed_by_peer()  # the old session is fenced off
        # A Renew of an older epoch is stale: refused, and that session ends.
        stale = NodeClient(plane, fresh)
        await stale.connect()  # epoch 3 fences epoch 2
        refused = await renew(stale, csr_for(node.key), epoch=2)
        assert isinstance(refused, wire.Refused) and refused.code == "stale_epoch"
        assert [t for t in plane.event_types(node.node_id)
                if t == "node.certificate.renewed"] == ["node.certificate.renewed"]
        await second.close()
        await stale.close()

    run_with_gateway(env, tmp_path, body)


# ------------------------------------------------------------------ bcd itself


def node_root(plane: Plane, node: JoinedNode, folder: Path) -> Paths:
    """A BCD root for a node joined through the real nodes.join, pointed at the gateway."""
    assert plane.gateway is not None
    paths = Paths(folder)
    paths.etc.mkdir(parents=True)
    paths.node_key.write_bytes(node.key_path.read_bytes())
    paths.node_key.chmod(0o600)
    paths.node_certificate.write_text(node.cert_pem)
    paths.node_ca_certificate.write_text(pki.pem(plane.bundle.node_ca_cert))
    paths.serving_ca_certificate.write_text(pki.pem(plane.bundle.serving_ca_cert))
    paths.join_encryption_jwk.write_text("{}\n")
    agent_config.save(paths.config, agent_config.AgentConfig(
        server=agent_config.ServerSection(
            url="https://127.0.0.1:1/api/compute",
            gateway_url=f"tls://localhost:{plane.gateway.port}",
            serving_ca_pin=pki.spki_pin(plane.bundle.serving_ca_cert.public_key())),
        node=agent_config.NodeSection(id=node.node_id, site_id=plane.site, pool_id=plane.pool,
                                      tenant_id="root"),
        files=agent_config.FilesSection(
            key=str(paths.node_key), certificate=str(paths.node_certificate),
            node_ca=str(paths.node_ca_certificate), serving_ca=str(paths.serving_ca_certificate),
            join_encryption_key=str(paths.join_encryption_jwk)),
    ))
    write_fake_fleet_file(folder / "gpus.json", gpus=8)  # the GPUs plane.join() joined with
    return paths


def agent_for(paths: Paths, clock: Callable[[], datetime], out: io.StringIO) -> NodeAgent:
    settings = load_settings(paths.config)
    options = NodeOptions(heartbeat_seconds=0.2, poll_seconds=0.1, report_every=5,
                          backoff=Backoff(base=0.05, cap=0.2), out=out,
                          renew_check_seconds=0.05, renew_retry_seconds=0.1,
                          renew_answer_timeout=5.0)
    return NodeAgent(settings, paths, FakeSource(paths.root / "gpus.json"), settings.load_key(),
                     options=options, clock=clock, devices=unsupported)


async def until(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """Poll a condition (no message marks it) under a deadline."""
    with anyio.fail_after(timeout):
        while not await anyio.to_thread.run_sync(condition):
            await anyio.sleep(0.02)


def test_bcd_renews_when_a_third_is_left_and_connects_with_the_new_certificate(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        assert plane.gateway is not None
        gateway = plane.gateway
        plane.clock.advance(-5 * DAY)  # joined five days ago (see above)
        node = plane.join()
        paths = node_root(plane, node, tmp_path / "bcd")
        admitted: list[int] = []
        identify = gateway._identify

        def recording_identify(cert: x509.Certificate, hello: wire.Hello) -> Any:
            admitted.append(cert.serial_number)
            return identify(cert, hello)

        gateway._identify = recording_identify  # type: ignore[method-assign]
        plane.clock.advance(5 * DAY)  # now; bcd and the gateway share the clock
        out = io.StringIO()
        agent = agent_for(paths, plane.clock, out)
        old_serial = x509.load_pem_x509_certificate(node.cert_pem.encode()).serial_number
        async with anyio.create_task_group() as group:
            await group.start(agent.run)
            await until(lambda: agent.renewal.renewals == 1)
            on_disk = x509.load_pem_x509_certificate(paths.node_certificate.read_bytes())
            assert on_disk.serial_number != old_serial
            assert spki(on_disk.public_key()) == spki(node.key.public_key())
            assert paths.node_key.read_bytes() == node.key_path.read_bytes()  # same key
            assert format(on_disk.serial_number, "x") == \
                plane.node(node.node_id)["certificate"]["serial"]
            config = agent_config.load(paths.config)
            assert config is not None and config.node is not None
            assert config.node.certificate_not_after == \
                plane.node(node.node_id)["certificate"]["notAfter"]
            assert "bcd node: certificate renewed; valid until" in out.getvalue()
            assert agent.snapshot()["certificate"]["renewals"] == 1
            assert admitted == [old_serial]

            # The next connection presents the renewed certificate; it is not renewed again.
            gateway.sessions[node.node_id].fence()
            await until(lambda: agent.session.epoch == 2 and agent.session.state == "connected")
            assert admitted == [old_serial, on_disk.serial_number]
            await until(lambda: gateway.stats["reports"] >= 2)
            group.cancel_scope.cancel()
        assert plane.event_types(node.node_id).count("node.certificate.renewed") == 1
        assert agent.renewal.renewals == 1

    run_with_gateway(env, tmp_path, body)


def test_a_refused_renewal_keeps_the_session_and_the_certificate(
        env: dict[str, str], tmp_path: Path) -> None:
    async def body(plane: Plane) -> None:
        assert plane.gateway is not None
        gateway = plane.gateway
        node = plane.join()
        paths = node_root(plane, node, tmp_path / "bcd")
        before = paths.node_certificate.read_bytes()
        # bcd's clock runs six days ahead of the control plane's: it asks, the gateway
        # finds the certificate young (renew_too_soon) and refuses.
        agent = agent_for(paths, lambda: plane.clock.now + timedelta(days=6), io.StringIO())
        async with anyio.create_task_group() as group:
            await group.start(agent.run)
            await until(lambda: gateway.stats["renewals_refused"] >= 2)  # retried, same session
            assert agent.session.state == "connected" and agent.session.epoch == 1
            assert agent.session.connects == 1
            assert paths.node_certificate.read_bytes() == before
            status = agent.snapshot()["certificate"]
            assert status["renewals"] == 0 and status["lastError"].startswith("renew_too_soon")
            group.cancel_scope.cancel()
        assert plane.event_types(node.node_id) == ["node.joined", "node.connected"]

    run_with_gateway(env, tmp_path, body)
