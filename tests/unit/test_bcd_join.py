"""bcd join against an in-memory control plane: what it sends, checks and writes.

Every refusal must leave BCD_ROOT/etc/bcd empty (no config, no key) and, where it
happens before the call, spend no token (the fake counts nodes.join calls).
"""

from __future__ import annotations

import base64
import io
import json
import stat
import tomllib
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from better_compute.agent.config import AgentConfig, ServerSection, save
from better_compute.agent.errors import BcdError
from better_compute.agent.gpu import write_fake_fleet_file
from better_compute.agent.join import JoinOptions, join
from better_compute.agent.paths import Paths
from better_compute.api import pki
from tests.bcd_fake_control_plane import NODE_ID, SITE_ID, TOKEN, FakeControlPlane, well_known_of

SERVER = "https://compute.example.com/api/compute"

Host = tuple[Paths, dict[str, str]]  # the host fixture: its Paths and its environment


@pytest.fixture
def host(tmp_path: Path) -> Host:
    """A machine under a temp BCD_ROOT with a fake 8-GPU source whose serial is SN-7701."""
    root = tmp_path / "root"
    root.mkdir()
    write_fake_fleet_file(tmp_path / "gpus.json", serial="SN-7701")
    env = {"BCD_ROOT": str(root), "BCD_GPU_SOURCE": f"fake:{tmp_path / 'gpus.json'}"}
    return Paths.from_env(env), env


def token_file(tmp_path: Path, mode: int = 0o600, text: str = TOKEN + "\n") -> Path:
    path = tmp_path / "join-token"
    path.write_text(text)
    path.chmod(mode)
    return path


def options(plane: FakeControlPlane, tmp_path: Path | None = None,
            **overrides: str | None) -> JoinOptions:
    values: dict[str, str | None] = {"server": SERVER, **plane.pins()}
    values["token_file"] = str(token_file(tmp_path)) if tmp_path else None
    values.update(overrides)
    return JoinOptions(**values)


def run_join(opts: JoinOptions, plane: FakeControlPlane, paths: Paths, env: dict[str, str],
             stdin: str | None = None) -> str:
    out = io.StringIO()
    code = join(opts, paths=paths, env=env, stdin=io.StringIO(stdin) if stdin else None, out=out,
                control_plane=plane)
    assert code == 0
    return out.getvalue()


def assert_nothing_written(paths: Paths) -> None:
    assert not paths.etc.exists() or list(paths.etc.iterdir()) == []


def test_join_writes_identity_only_after_verifying(host: Host, tmp_path: Path) -> None:
    paths, env = host
    plane = FakeControlPlane()
    opts = options(plane, tmp_path)
    out = run_join(opts, plane, paths, env)

    cert = x509.load_pem_x509_certificate(paths.node_certificate.read_bytes())
    until = cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert out == f"joined as {NODE_ID} (site {SITE_ID}, role node); certificate valid until {until}\n"
    # The key was made here and is the certificate's; only its owner can read it.
    key = serialization.load_pem_private_key(paths.node_key.read_bytes(), None)
    assert cert.public_key() == key.public_key()
    assert stat.S_IMODE(paths.node_key.stat().st_mode) == 0o600
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(
        paths.node_ca_certificate.read_bytes()))
    assert paths.serving_ca_certificate.read_text() == pki.pem(plane.bundle.serving_ca_cert)
    jwk = json.loads(paths.join_encryption_jwk.read_text())
    raw = plane.bundle.join_encryption_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert jwk["kty"] == "OKP" and jwk["crv"] == "X25519"
    assert base64.urlsafe_b64decode(jwk["x"] + "=") == raw
    config = tomllib.loads(paths.config.read_text())
    assert config["server"] == {"url": SERVER, "gateway_url": "https://gw.example.com:8443",
                                **plane.pins()}
    assert config["node"]["id"] == NODE_ID and config["node"]["site_id"] == SITE_ID
    assert config["files"]["key"] == str(paths.node_key)
    # The token file is gone; the request carried the token, the machine's facts and a CSR.
    assert not Path(opts.token_file or "").exists()
    request = plane.requests[0]
    assert request.token == TOKEN and request.hardware.serial == "SN-7701"
    assert len(request.hardware.gpus) == 8 and request.hardware.macs
    csr = x509.load_pem_x509_csr(request.csr_pem.encode())
    assert csr.public_key() == key.public_key()


def test_second_join_says_already_joined_and_contacts_nothing(host: Host, tmp_path: Path) -> None:
    paths, env = host
    first = "bcjt_" + "a" * 26 + ".first-secret-0123456789abcdefghijkl"
    plane = FakeControlPlane(token=first)
    run_join(options(plane), plane, paths, {**env, "BCD_JOIN_TOKEN": first})
    before = paths.config.read_bytes()
    assert tomllib.loads(before.decode())["node"]["join_token_id"] == "jt_" + "a" * 26
    calls = plane.calls
    # Its token file was deleted by the join: run again as written, then with the same token.
    assert run_join(options(plane, token_file=str(tmp_path / "gone")), plane, paths, env) \
        == f"already joined as {NODE_ID}\n"
    out = run_join(options(plane), plane, paths, env, stdin=first + "\n")
    assert out == f"already joined as {NODE_ID}\n"
    assert plane.calls == calls and paths.config.read_bytes() == before


@pytest.mark.parametrize("change", ["token", "not-a-token", "pin", "server"])
def test_a_join_that_contradicts_the_one_made_is_refused(host: Host, tmp_path: Path,
                                                          change: str) -> None:
    """Another token, another control plane or other pins on a joined machine: an error
    (conflict, exit status 6) that changes nothing, never "already joined" and exit 0."""
    paths, env = host
    first = "bcjt_" + "a" * 26 + ".first-secret-0123456789abcdefghijkl"
    plane = FakeControlPlane(token=first)
    run_join(options(plane), plane, paths, env, stdin=first)
    before = paths.config.read_bytes()
    opts, stdin = options(plane), first
    if change == "token":
        stdin = "bcjt_" + "b" * 26 + ".other-secret-0123456789abcdefghijkl"
    elif change == "not-a-token":
        stdin = "another-token"
    elif change == "pin":
        opts = options(FakeControlPlane())  # another PKI's pins
    else:
        opts = options(plane, server="https://other.example.com/api/compute")
    with pytest.raises(BcdError, match=f"already joined as {NODE_ID}, and ") as refused:
        join(opts, paths=paths, env=env, stdin=io.StringIO(stdin), out=io.StringIO(),
             control_plane=plane)
    assert refused.value.code == "conflict" and refused.value.exit_code == 6
    assert "nothing was changed" in str(refused.value)
    assert paths.config.read_bytes() == before and plane.calls == 1


def test_token_from_environment_and_from_standard_input(host: Host) -> None:
    paths, env = host
    plane = FakeControlPlane()
    run_join(options(plane), plane, paths, {**env, "BCD_JOIN_TOKEN": TOKEN})
    assert plane.requests[0].token == TOKEN
    paths.config.unlink()
    run_join(options(plane), plane, paths, env, stdin=f"# join token\n{TOKEN}\n")
    assert [r.token for r in plane.requests] == [TOKEN, TOKEN]


def test_pre_join_config_supplies_server_and_pins(host: Host) -> None:
    paths, env = host
    plane = FakeControlPlane()
    pins = plane.pins()
    paths.etc.mkdir(parents=True)
    save(paths.config, AgentConfig(server=ServerSection(url=SERVER, **pins)))
    out = run_join(JoinOptions(), plane, paths, env, stdin=TOKEN)
    assert out.startswith(f"joined as {NODE_ID}")
    assert tomllib.loads(paths.config.read_text())["server"]["url"] == SERVER


def _refused(plane: FakeControlPlane, opts: JoinOptions, paths: Paths, env: dict[str, str],
             match: str) -> None:
    with pytest.raises(BcdError, match=match):
        join(opts, paths=paths, env=env, stdin=None, out=io.StringIO(), control_plane=plane)
    assert_nothing_written(paths)


@pytest.mark.parametrize("pin", ["serving_ca_pin", "join_signing_pin", "join_encryption_pin"])
def test_a_wrong_pin_of_each_kind_is_refused_before_the_token_is_sent(host: Host, tmp_path: Path,
                                                                      pin: str) -> None:
    paths, env = host
    plane = FakeControlPlane()
    other = FakeControlPlane(bundle=pki.generate_bundle()).pins()[pin]
    opts = options(plane, tmp_path, **{pin: other})
    _refused(plane, opts, paths, env, "pin")
    assert plane.calls == 0 and Path(opts.token_file or "").exists()


def test_a_document_whose_key_does_not_match_its_published_pin_is_refused(host: Host,
                                                                          tmp_path: Path) -> None:
    paths, env = host
    plane = FakeControlPlane()
    stranger = pki.public_parts(pki.generate_bundle())
    true = well_known_of(plane.bundle)
    plane.document = msgspec.structs.replace(
        true, join_encryption_public_key=stranger["joinEncryptionPublicKey"])
    _refused(plane, options(plane, tmp_path), paths, env, "altered")
    assert plane.calls == 0


@pytest.mark.parametrize(("misbehave", "match"), [
    ("forge", "signature does not verify"),
    ("tamper", "signature does not verify"),
    ("nonce", "nonce"),
    ("foreign-ca", "not issued by the node CA"),
    ("other-key", "not for this machine's key"),
])
def test_a_bad_join_response_is_refused_and_nothing_written(host: Host, tmp_path: Path,
                                                             misbehave: str, match: str) -> None:
    paths, env = host
    plane = FakeControlPlane(misbehave=misbehave)
    opts = options(plane, tmp_path)
    _refused(plane, opts, paths, env, match)
    assert Path(opts.token_file or "").exists()  # kept: the operator may need it to retry


def test_the_control_planes_refusal_is_shown_as_it_said_it(host: Host, tmp_path: Path) -> None:
    paths, env = host
    plane = FakeControlPlane(token="bcjt_another-one")
    _refused(plane, options(plane, tmp_path), paths, env, "the join token is not valid")


@pytest.mark.parametrize("missing", ["server", "serving_ca_pin", "join_signing_pin",
                                     "join_encryption_pin"])
def test_missing_server_or_pin_is_named(host: Host, tmp_path: Path, missing: str) -> None:
    paths, env = host
    plane = FakeControlPlane()
    flag = "--" + missing.replace("_", "-")
    _refused(plane, options(plane, tmp_path, **{missing: None}), paths, env, flag)


def test_plain_http_and_malformed_pins_are_refused(host: Host, tmp_path: Path) -> None:
    paths, env = host
    plane = FakeControlPlane()
    _refused(plane, options(plane, tmp_path, server="http://compute.example.com/api/compute"),
             paths, env, "https")
    _refused(plane, options(plane, tmp_path, join_signing_pin="abc"), paths, env, "not a pin")


def test_a_broken_gpu_source_stops_the_join(host: Host, tmp_path: Path) -> None:
    paths, env = host
    plane = FakeControlPlane()
    env = {**env, "BCD_GPU_SOURCE": f"fake:{tmp_path / 'missing.json'}"}
    _refused(plane, options(plane, tmp_path), paths, env, "cannot read the GPUs")
    assert plane.calls == 0
