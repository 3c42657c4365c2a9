"""Throwaway PostgreSQL clusters the way production runs them: TLS, sockets, a standby.

``scripts/pg start`` makes a cluster (trust authentication, loopback, its unix socket
in the cluster's folder); this adds what the store's URL tests need: TLS with a
certificate made here (``ssl=on``, and pg_hba refusing TCP without TLS, so nothing can
quietly connect in the clear), and a streaming-replication standby made with
pg_basebackup that can be promoted (a real failover of the primary). As root, the
servers run as ``nobody``, the way scripts/pg runs them.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import eventually, free_port

REPO = Path(__file__).resolve().parent.parent
ROOT = os.getuid() == 0


def _bin(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if found is None:
        raise RuntimeError(f"{name} not found: install PostgreSQL 15 (scripts/pg needs it too)")
    return found


def _as_server_user(argv: list[str]) -> list[str]:
    if not ROOT:
        return argv
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--reset-env",
            "--", "env", f"PATH={os.environ.get('PATH', '')}", *argv]


def _give_to_server(path: Path) -> None:
    if ROOT:
        shutil.chown(path, "nobody", "nogroup")


@dataclass
class Cluster:
    folder: Path  # holds data/, server.log and the unix socket
    port: int

    def url(self, host: str = "127.0.0.1", **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://bc@{host}:{self.port}/postgres" + (f"?{query}" if query else "")

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """A superuser session over the unix socket (never refused for want of TLS)."""
        return psycopg.connect(host=str(self.folder), port=self.port, user="bc",
                               dbname="postgres", autocommit=True, connect_timeout=10)

    def pg_ctl(self, *argv: str) -> None:
        done = subprocess.run(_as_server_user([_bin("pg_ctl"), "-D", str(self.folder / "data"),
                                               *argv]), capture_output=True, text=True,
                              timeout=120)
        log = self.folder / "server.log"
        assert done.returncode == 0, (argv, done.stderr, log.read_text()[-3000:]
                                      if log.exists() else "")

    def start(self) -> None:
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off "
                   "-c synchronous_commit=off -c max_connections=400")
        self.pg_ctl("-l", str(self.folder / "server.log"), "-w", "-t", "60", "-o", options,
                    "start")

    def stop(self) -> None:
        """A fast shutdown, as an operator's restart or a failover does: every WAL record
        reaches the standbys before the server exits."""
        self.pg_ctl("-m", "fast", "-w", "-t", "60", "stop")

    def promote(self) -> None:
        self.pg_ctl("-w", "-t", "60", "promote")


@contextlib.contextmanager
def cluster() -> Iterator[Cluster]:
    """A fresh primary (scripts/pg start), stopped and deleted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="bc-pg.", dir="/tmp"))  # short: socket paths
    port = free_port()
    try:
        done = subprocess.run([str(REPO / "scripts" / "pg"), "start", str(folder), str(port)],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        yield Cluster(folder, port)
    finally:
        subprocess.run([str(REPO / "scripts" / "pg"), "stop", str(folder)],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def standby_of(primary: Cluster) -> Iterator[Cluster]:
    """A hot standby streaming from ``primary`` (read-only until promoted)."""
    folder = Path(tempfile.mkdtemp(prefix="bc-pg.", dir="/tmp"))
    _give_to_server(folder)
    standby = Cluster(folder, free_port())
    try:
        done = subprocess.run(_as_server_user([
            _bin("pg_basebackup"), "-D", str(folder / "data"), "-h", "127.0.0.1",
            "-p", str(primary.port), "-U", "bc", "-X", "stream", "-R", "--no-sync"]),
            capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        standby.start()
        yield standby
    finally:
        with contextlib.suppress(AssertionError, subprocess.SubprocessError):
            standby.pg_ctl("-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Tls:
    ca_file: Path  # what clients pin with sslrootcert
    other_ca_file: Path  # a CA that signed nothing of this server's


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key, now = _key(), datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(common_name))
            .issuer_name(_name(common_name)).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def enable_tls(server: Cluster) -> Tls:
    """Serve TLS with a certificate for 127.0.0.1 and localhost from a CA made here, and
    refuse every TCP connection without TLS (pg_hba ``hostnossl … reject``)."""
    ca_key, ca_cert = _ca("better-compute test database CA")
    _, other_cert = _ca("some other CA")
    key, now = _key(), datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("localhost"))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = {
        "server.crt": cert.public_bytes(serialization.Encoding.PEM),
        "server.key": key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()),
        "root.crt": ca_cert.public_bytes(serialization.Encoding.PEM),
        "other.crt": other_cert.public_bytes(serialization.Encoding.PEM),
    }
    for name, data in files.items():
        path = server.folder / name
        path.write_bytes(data)
        path.chmod(0o600 if name == "server.key" else 0o644)
        _give_to_server(path)
    hba = server.folder / "data" / "pg_hba.conf"
    hba.write_text("local all all trust\nlocal replication all trust\n"
                   "hostssl all all 127.0.0.1/32 trust\n"
                   "hostnossl all all 127.0.0.1/32 reject\n")
    with server.admin() as conn:
        conn.execute(f"ALTER SYSTEM SET ssl_cert_file = '{server.folder / 'server.crt'}'")
        conn.execute(f"ALTER SYSTEM SET ssl_key_file = '{server.folder / 'server.key'}'")
        conn.execute("ALTER SYSTEM SET ssl = on")
        conn.execute("SELECT pg_reload_conf()")

    def serves_tls() -> bool:
        try:
            with psycopg.connect(server.url(sslmode="require"), connect_timeout=5):
                return True
        except psycopg.OperationalError:
            return False

    eventually(serves_tls, "PostgreSQL serves TLS after the reload", timeout=60)
    return Tls(server.folder / "root.crt", server.folder / "other.crt")
