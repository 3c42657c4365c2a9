"""`better-compute init`: the store, the sealed PKI bundle, the root tenant and its token.

The token is printed once (or written 0600 with --out, never overwriting);
the serving CA's certificate lands in the data dir at the path init prints;
the master key file is 0600 and the store holds no private key in the clear.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
import pytest

from better_compute.api import pki
from better_compute.api.runtime import Runtime
from better_compute.api.store.store_url import without_schema
from tests.support import cli_inprocess, open_runtime

TOKEN_RE = re.compile(r"biam_[A-Za-z0-9_-]{20,}")


def head(env: Mapping[str, str]) -> int:
    rt = open_runtime(env)
    try:
        return rt.store.recorder.max_notification_id() or 0
    finally:
        rt.close()


def stored_bytes(env: Mapping[str, str]) -> Iterator[bytes]:
    """Every value of every table of the store, as bytes (SQLite: the files themselves)."""
    url = env.get("BETTER_COMPUTE_DATABASE_URL")
    if not url:
        for path in Path(env["BETTER_COMPUTE_DATA_DIR"]).glob("store.sqlite*"):
            yield path.read_bytes()
        return
    base, schema = without_schema(url)
    with psycopg.connect(base) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,))]
        assert tables, f"no tables in schema {schema}"
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    if isinstance(value, bytes | memoryview):
                        yield bytes(value)
                    elif value is not None:
                        yield str(value).encode()


def test_init_prints_the_token_once_and_the_ca_path(env: dict[str, str]) -> None:
    code, out, err = cli_inprocess(["init"], env)
    assert code == 0, err
    tokens = TOKEN_RE.findall(out + err)
    assert len(tokens) == 1 and out.strip().splitlines()[-1] == tokens[0]
    data = Path(env["BETTER_COMPUTE_DATA_DIR"])
    ca = data / "serving-ca.pem"
    assert f"serving CA certificate: {ca}" in out
    assert f"export BETTER_COMPUTE_CA_FILE={ca}" in out
    code, whoami, _ = cli_inprocess(["api", "system.whoami", "--query", "tenantId"],
                                    {**env, "BETTER_COMPUTE_TOKEN": tokens[0]})
    assert (code, whoami) == (0, "root\n")
    code, shown, _ = cli_inprocess(["pki", "show", "--query", "servingCaCertificate"], env)
    assert code == 0 and shown.strip() == ca.read_text().strip()
    assert ca.read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert stat.S_IMODE((data / "master.key").stat().st_mode) == 0o600


def test_the_store_keeps_no_private_key_and_no_token_in_the_clear(env: dict[str, str]) -> None:
    code, out, _ = cli_inprocess(["init"], env)
    assert code == 0
    secret = out.strip().splitlines()[-1]
    master = (Path(env["BETTER_COMPUTE_DATA_DIR"]) / "master.key").read_text().strip()
    blob = b"\n".join(stored_bytes(env))
    assert b"BEGIN CERTIFICATE" in blob  # the scan does see the bundle's public half
    assert b"PRIVATE KEY" not in blob
    assert secret.encode() not in blob and master.encode() not in blob
    assert master.removeprefix("bcmk1_").encode() not in blob


def test_the_master_key_opens_the_sealed_bundle(env: dict[str, str]) -> None:
    assert cli_inprocess(["init"], env)[0] == 0
    rt = Runtime.open(env)
    try:
        bundle = pki.unseal_bundle(rt.service.pki().sealed,
                                   pki.parse_master_key(rt.master_key_text()))
        shown = rt.service.pki().to_doc()
        assert pki.spki_pin(bundle.serving_ca_cert.public_key()) == shown["servingCaSpkiPin"]
        assert pki.spki_pin(bundle.join_signing_key.public_key()) == shown["joinSigningKeyPin"]
        assert pki.spki_pin(bundle.join_encryption_key.public_key()) == \
            shown["joinEncryptionKeyPin"]
        with pytest.raises(Exception, match="does not open"):
            pki.unseal_bundle(rt.service.pki().sealed,
                              pki.parse_master_key(pki.new_master_key()))
    finally:
        rt.close()


def test_out_writes_the_token_0600_and_prints_it_nowhere(env: dict[str, str],
                                                         tmp_path: Path) -> None:
    target = tmp_path / "root-token"
    code, out, err = cli_inprocess(["init", "--out", str(target)], env)
    assert code == 0, err
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    secret = target.read_text().strip()
    assert TOKEN_RE.fullmatch(secret)
    assert secret not in out + err and not TOKEN_RE.search(out + err)
    assert str(target) in out


def test_a_second_init_is_refused_and_changes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    assert cli_inprocess(["init"], env)[0] == 0
    data = Path(env["BETTER_COMPUTE_DATA_DIR"])
    key, ca = (data / "master.key").read_text(), (data / "serving-ca.pem").read_text()
    before = head(env)
    target = tmp_path / "second-token"
    code, out, err = cli_inprocess(["init", "--out", str(target)], env)
    assert code == 6 and out == "" and err.startswith("error [conflict]: ")
    assert "already initialized" in err
    assert not target.exists()
    assert head(env) == before
    assert (data / "master.key").read_text() == key and (data / "serving-ca.pem").read_text() == ca


def test_out_never_overwrites_and_then_nothing_is_initialized(env: dict[str, str],
                                                              tmp_path: Path) -> None:
    existing = tmp_path / "token"
    existing.write_text("precious\n")
    code, out, err = cli_inprocess(["init", "--out", str(existing)], env)
    assert (code, out) == (6, "")  # conflict
    assert "already exists" in err and "never overwritten" in err
    assert existing.read_text() == "precious\n"
    assert head(env) == 0
    assert not (Path(env["BETTER_COMPUTE_DATA_DIR"]) / "master.key").exists()


def test_init_creates_a_data_dir_that_does_not_exist_yet(env: dict[str, str],
                                                         tmp_path: Path) -> None:
    fresh = {**env, "BETTER_COMPUTE_DATA_DIR": str(tmp_path / "new" / "data")}
    code, _, err = cli_inprocess(["init"], fresh)
    assert code == 0, err
    assert (tmp_path / "new" / "data" / "serving-ca.pem").is_file()
    assert stat.S_IMODE((tmp_path / "new" / "data" / "master.key").stat().st_mode) == 0o600


def test_a_master_key_given_in_the_environment_is_used_and_not_written(
        env: dict[str, str]) -> None:
    key = pki.new_master_key()
    with_key = {**env, "BETTER_COMPUTE_MASTER_KEY": key}
    code, out, err = cli_inprocess(["init"], with_key)
    assert code == 0, err
    assert "from BETTER_COMPUTE_MASTER_KEY" in out and key not in out
    assert not (Path(env["BETTER_COMPUTE_DATA_DIR"]) / "master.key").exists()
    rt = Runtime.open(with_key)
    try:
        pki.unseal_bundle(rt.service.pki().sealed, pki.parse_master_key(key))
    finally:
        rt.close()
