"""What `bcd node` needs from config.toml: who this node is, where the gateway is, its TLS.

The gateway URL in config.toml's ``[server] gateway_url`` may be written either way:

* ``tls://HOST:PORT`` (the port is required), or
* ``https://HOST[:PORT]`` (port 443 when left out), as the install script and the
  well-known document publish it. The session is not HTTP either way: it is TLS
  carrying newline-delimited JSON (api/wire/gateway.py); the scheme only names TLS.

Trust is narrow on both sides: bcd presents its node certificate and the key that
never left the machine, and trusts ONLY the serving CA of config.toml for the
gateway's certificate (never the system store), after checking that CA against the
pinned ``serving_ca_pin``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from .. import config as config_file
from ..control_plane import ca_pin
from ..errors import BcdError, io_code
from ..paths import Paths

_DEFAULT_PORTS = {"https": 443}
NodeKey = ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    url: str  # as config.toml spells it, for messages and `bcd status`


@dataclass(frozen=True)
class NodeIdentity:
    node_id: str
    site_id: str
    pool_id: str
    tenant_id: str


@dataclass(frozen=True)
class NodeSettings:
    config_path: Path
    identity: NodeIdentity
    gateway: Endpoint
    key_path: Path
    certificate_path: Path
    serving_ca_path: Path
    serving_ca_pin: str | None
    node_ca_path: Path | None = None  # checks renewed certificates (agent/node/renewal.py)
    device_plugin_dir: Path | None = None  # [kubernetes]; None: BCD_ROOT/var/lib/kubelet/...
    cdi_generate: tuple[str, ...] | None = None  # [container_toolkit]; None: nvidia-ctk ...
    metrics_listen: str | None = None  # [metrics] listen
    log_format: str | None = None  # [log] format

    def load_key(self) -> NodeKey:
        """The node's private key (it signs journal entries and the TLS handshake)."""
        try:
            data = self.key_path.read_bytes()
        except FileNotFoundError:
            raise BcdError(
                f"the node key {self.key_path} is missing: this machine's identity is gone. "
                "A config copied from another machine is useless without its key; join this "
                "machine afresh with a new join token (move config.toml away, then bcd join)"
            ) from None
        except OSError as exc:
            raise BcdError(f"cannot read the node key {self.key_path}: {exc.strerror}; "
                           "run bcd node as root", code=io_code(exc)) from None
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError):
            raise BcdError(f"{self.key_path} is not a PEM private key: restore it or join "
                           "this machine afresh") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
            raise BcdError(f"{self.key_path} holds a {type(key).__name__}; node keys are EC "
                           "P-256 or Ed25519")
        return key

    def ssl_context(self) -> ssl.SSLContext:
        """Client TLS: present the node certificate, trust only the serving CA."""
        try:
            ca_text = self.serving_ca_path.read_text()
        except OSError as exc:
            raise BcdError(f"cannot read the serving CA {self.serving_ca_path}: {exc.strerror}; "
                           "restore it from the control plane (better-compute pki show) or "
                           "join afresh") from None
        if self.serving_ca_pin and ca_pin(ca_text) != self.serving_ca_pin:
            raise BcdError(
                f"{self.serving_ca_path} does not match config.toml's serving_ca_pin "
                f"{self.serving_ca_pin}: refusing to trust it. Restore the file the join wrote, "
                "or join afresh"
            )
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca_text)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.certificate_path, self.key_path)
        except FileNotFoundError as exc:
            raise BcdError(f"{exc.filename} is missing: join this machine afresh") from None
        except ssl.SSLError:
            raise BcdError(
                f"the node certificate {self.certificate_path} is not for the node key "
                f"{self.key_path} (or either is damaged): bcd cannot prove who it is. Join this "
                "machine afresh with a new join token"
            ) from None
        return context


def parse_gateway_url(url: str | None, config_path: Path) -> Endpoint:
    if not url:
        raise BcdError(
            f"{config_path} has no gateway_url in [server]: the control plane did not publish "
            "one at join time. Set gateway_url = \"tls://HOST:PORT\" (the address of "
            "`better-compute serve --gateway-listen`) under [server]", code="invalid_input"
        )
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    if scheme not in ("tls", "https") or not parts.hostname or port is None or \
            parts.path not in ("", "/"):
        raise BcdError(
            f"gateway_url {url!r} in {config_path} is not a gateway address: write "
            "tls://HOST:PORT or https://HOST[:PORT] (no path)", code="invalid_input"
        )
    return Endpoint(host=parts.hostname, port=port, url=url.strip())


def resolve_config_path(given: str | None, paths: Paths) -> Path:
    """The config to read: ``--config``, else BCD_ROOT/etc/bcd/config.toml.

    With BCD_ROOT set, an absolute ``--config`` that does not exist as given is looked
    up under BCD_ROOT too, so the tutorial's ``--config /etc/bcd/config.toml`` works
    unchanged in a test root.
    """
    if not given:
        return paths.config
    path = Path(given)
    if path.exists() or not path.is_absolute() or paths.root == Path("/"):
        return path
    rooted = paths.under(str(path))
    return rooted if rooted.exists() else path


def load_settings(config_path: Path) -> NodeSettings:
    config = config_file.load(config_path)
    if config is None:
        raise BcdError(
            f"{config_path} does not exist: this machine has not joined. Run `bcd join` first "
            "(see docs/bcd.md), or pass the right --config", code="not_initialized"
        )
    if config.node is None or config.files is None:
        raise BcdError(
            f"{config_path} has no [node]: this machine has not joined yet. Run `bcd join` "
            "with a join token first", code="not_initialized"
        )
    node = config.node
    return NodeSettings(
        config_path=config_path,
        identity=NodeIdentity(node.id, node.site_id, node.pool_id, node.tenant_id),
        gateway=parse_gateway_url(config.server.gateway_url, config_path),
        key_path=Path(config.files.key),
        certificate_path=Path(config.files.certificate),
        serving_ca_path=Path(config.files.serving_ca),
        serving_ca_pin=config.server.serving_ca_pin,
        node_ca_path=Path(config.files.node_ca),
        device_plugin_dir=Path(config.kubernetes.device_plugin_dir)
        if config.kubernetes and config.kubernetes.device_plugin_dir else None,
        cdi_generate=tuple(config.container_toolkit.cdi_generate)
        if config.container_toolkit and config.container_toolkit.cdi_generate else None,
        metrics_listen=config.metrics.listen if config.metrics else None,
        log_format=config.log.format if config.log else None,
    )
