"""Every host path bcd touches, under one root (BCD_ROOT; unset means ``/``).

Tests and simulated fleets set BCD_ROOT to a temp dir and run unprivileged:
nothing in bcd names /etc, /run or /sys except through :class:`Paths`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT_ENV = "BCD_ROOT"


@dataclass(frozen=True)
class Paths:
    root: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Paths:
        value = (os.environ if env is None else env).get(ROOT_ENV, "")
        return cls(Path(value) if value else Path("/"))

    def under(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    @property
    def etc(self) -> Path:
        """``/etc/bcd``: the config and the node's identity (key, certificates)."""
        return self.under("etc/bcd")

    @property
    def config(self) -> Path:
        return self.etc / "config.toml"

    @property
    def node_key(self) -> Path:
        """The node's private key, generated on the machine; mode 0600, never sent anywhere."""
        return self.etc / "node.key"

    @property
    def node_certificate(self) -> Path:
        return self.etc / "node.crt"

    @property
    def node_ca_certificate(self) -> Path:
        return self.etc / "node-ca.crt"

    @property
    def serving_ca_certificate(self) -> Path:
        return self.etc / "serving-ca.crt"

    @property
    def join_encryption_jwk(self) -> Path:
        """The control plane's join encryption public key (X25519, an OKP JWK)."""
        return self.etc / "join-encryption.jwk"

    @property
    def cdi(self) -> Path:
        return self.under("etc/cdi")

    @property
    def run(self) -> Path:
        return self.under("run/bcd")

    @property
    def socket(self) -> Path:
        """The unix socket `bcd status` reads the running agent through."""
        return self.run / "bcd.sock"

    @property
    def allocations(self) -> Path:
        return self.run / "allocations"

    @property
    def sys(self) -> Path:
        """Where sysfs is read (DMI serial and product UUID, network interfaces)."""
        return self.under("sys")

    @property
    def device_plugins(self) -> Path:
        """The kubelet's device-plugin folder (kubelet.sock; bcd serves bcd-gpu.sock there)."""
        return self.under("var/lib/kubelet/device-plugins")
