"""BCD_ROOT/etc/bcd/config.toml: where the control plane is, and who this node is.

Two shapes of the same file:

* before the join (the install script writes it): ``[server]`` only, with the API
  URL, the gateway URL and the three pins; ``bcd join`` uses them when its flags
  are absent.
* after the join (``bcd join`` writes it, atomically, last of all its files):
  ``[server]`` plus ``[node]`` (the ids the control plane gave) and ``[files]``
  (the key and certificates). A config with ``[node]`` means "joined".

The file is written by people too, so unknown keys are refused with their path
(a typo silently ignored would leave, say, a pin unchecked). docs/bcd.md has the
reference.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from .errors import BcdError, io_code
from .files import write_atomic


class _Section(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    pass


class ServerSection(_Section, kw_only=True):
    url: str | None = None  # the API root, https://HOST/api/compute
    gateway_url: str | None = None
    serving_ca_pin: str | None = None
    join_signing_pin: str | None = None
    join_encryption_pin: str | None = None


class NodeSection(_Section, kw_only=True):
    id: str
    site_id: str
    pool_id: str
    tenant_id: str
    role: str = "node"
    certificate_not_after: str | None = None  # RFC 3339
    join_token_id: str | None = None  # jt_…: the join token this machine joined with


class FilesSection(_Section, kw_only=True):
    key: str
    certificate: str
    node_ca: str
    serving_ca: str
    join_encryption_key: str


class KubernetesSection(_Section, kw_only=True):
    """Where the kubelet's device-plugin folder is (its kubelet.sock; bcd-gpu.sock beside it)."""

    device_plugin_dir: str | None = None  # default /var/lib/kubelet/device-plugins under BCD_ROOT


class ContainerToolkitSection(_Section, kw_only=True):
    """The container-toolkit unit: the command whose standard output is NVIDIA's CDI spec."""

    cdi_generate: list[str] | None = None  # default: nvidia-ctk cdi generate --format=json ...


class MetricsSection(_Section, kw_only=True):
    """``bcd node``'s Prometheus listener (docs/metrics.md); ``--metrics-listen`` wins."""

    listen: str | None = None  # "PORT" (on 127.0.0.1) or "HOST:PORT"


class LogSection(_Section, kw_only=True):
    format: str | None = None  # "text" (default) or "json"; ``--log-format`` wins


class AgentConfig(_Section, kw_only=True):
    server: ServerSection = msgspec.field(default_factory=ServerSection)
    node: NodeSection | None = None
    files: FilesSection | None = None
    kubernetes: KubernetesSection | None = None
    container_toolkit: ContainerToolkitSection | None = None
    metrics: MetricsSection | None = None
    log: LogSection | None = None

    @property
    def joined(self) -> bool:
        return self.node is not None


_HEADER = (
    "# bcd's configuration (docs/bcd.md). Written by `bcd join`; [server] may be edited.\n"
)


def load(path: Path) -> AgentConfig | None:
    """The config at ``path``, None when there is none; BcdError naming the bad field."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BcdError(f"cannot read {path}: {exc.strerror}; run bcd as root or fix its mode",
                       code=io_code(exc)) from None
    try:
        return msgspec.toml.decode(data, type=AgentConfig)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BcdError(
            f"{path} is not a valid bcd config: {exc}. Fix that line (docs/bcd.md lists "
            "every key) or move the file away to join afresh", code="invalid_input"
        ) from None


def save(path: Path, config: AgentConfig) -> None:
    """Write the config atomically (temp file + rename); it holds no secret (mode 0644)."""
    write_atomic(path, _HEADER.encode() + msgspec.toml.encode(config), mode=0o644)
