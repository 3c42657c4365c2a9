"""daemon install-script: a POSIX sh script that installs bcd and joins the machine.

The script pins bcd's SHA-256 per architecture and the control plane's three
pins (read from the PKI bundle through ``pki.show``), so a machine that runs it
verifies what it downloads before running anything. The template is
api/install_bcd.sh; docs/join.md describes what it does and the unit it installs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from better_compute.api.net import is_loopback
from better_compute.cli.context import Context
from better_compute.cli.files import check_new_file
from better_compute.cli.registry import add_group, add_verb
from better_compute.domain.errors import Conflict, InvalidInput

ARCHES = ("amd64", "arm64")
_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+~-]{0,63}\Z")
_HEX_RE = re.compile(r"^[0-9a-f]{64}\Z")
_PIN_RE = re.compile(r"^sha256/[A-Za-z0-9+/]{43}=\Z")
_URL_UNSAFE = re.compile(r"[\s\"'\\`$]")

BCD_UNIT = """\
[Unit]
Description=better-compute node agent (bcd)
Documentation=https://github.com/better-compute/better-compute/blob/main/docs/bcd.md
Wants=network-online.target
After=network-online.target

[Service]
Type=notify
NotifyAccess=main
ExecStart=/usr/local/bin/bcd node --config /etc/bcd/config.toml
Restart=always
RestartSec=5
RestartPreventExitStatus=3
RuntimeDirectory=bcd
RuntimeDirectoryMode=0750
RuntimeDirectoryPreserve=yes

[Install]
WantedBy=multi-user.target
"""


def parse_digests(items: list[str]) -> dict[str, str]:
    """``amd64=HEX [arm64=HEX]`` -> {arch: hex}; every arch at most once."""
    digests: dict[str, str] = {}
    for item in items:
        arch, sep, value = item.partition("=")
        value = value.strip().lower()
        if not sep or arch not in ARCHES:
            raise InvalidInput(
                f"--sha256 {item!r} is not ARCH=HEX with ARCH amd64 or arm64: write "
                "--sha256 amd64=$(sha256sum bin/bcd | cut -d' ' -f1)"
            )
        if not _HEX_RE.match(value):
            raise InvalidInput(
                f"--sha256 {arch}=… is not a SHA-256 digest: give the 64 hex digits sha256sum "
                "prints for that architecture's bcd file"
            )
        if arch in digests:
            raise InvalidInput(f"--sha256 gives {arch} twice: give each architecture once")
        digests[arch] = value
    if not digests:
        raise InvalidInput("--sha256 needs at least one ARCH=HEX (for example amd64=…)")
    return digests


def check_url(text: str, flag: str, *, schemes: tuple[str, ...]) -> str:
    parsed = urlparse(text)
    if parsed.scheme not in schemes or not parsed.hostname or _URL_UNSAFE.search(text):
        raise InvalidInput(
            f"{flag} {text!r} is not a {' or '.join(schemes)} URL (for example "
            f"{schemes[0]}://compute.example.com)"
        )
    if parsed.scheme == "http" and not is_loopback(parsed.hostname):
        raise InvalidInput(
            f"{flag} {text!r} uses plain http to a non-loopback host: use https://"
        )
    return text.rstrip("/")


def check_version(text: str) -> str:
    if not _VERSION_RE.match(text):
        raise InvalidInput(
            f"--bcd-version {text!r} is not a version: use letters, digits and . + ~ - "
            "(for example 0.1.0), as in the file name bcd_<version>_linux_<arch>"
        )
    return text


def render_script(*, pool: str, site: str, base_url: str, gateway_url: str | None,
                  version: str, digests: dict[str, str], pki: dict[str, Any]) -> str:
    """The install script with every value filled in (shell-quoted where assigned)."""
    for name in ("servingCaSpkiPin", "joinSigningKeyPin", "joinEncryptionKeyPin"):
        if not _PIN_RE.match(str(pki.get(name, ""))):
            raise InvalidInput(f"the control plane's {name} is not a sha256/… pin")
    base = base_url.removesuffix("/api/compute")
    quoted = {
        "BASE_URL": base,
        "SERVER_URL": base + "/api/compute",
        "GATEWAY_URL": gateway_url or "",
        "SERVING_CA_PIN": pki["servingCaSpkiPin"],
        "JOIN_SIGNING_PIN": pki["joinSigningKeyPin"],
        "JOIN_ENCRYPTION_PIN": pki["joinEncryptionKeyPin"],
        "VERSION": version,
        "SHA256_AMD64": digests.get("amd64", ""),
        "SHA256_ARM64": digests.get("arm64", ""),
    }
    from importlib import resources

    ca = str(pki["servingCaCertificate"])
    text = resources.files("better_compute.api").joinpath("install_bcd.sh").read_text()
    raw = {"POOL": pool, "SITE": site, "VERSION_TEXT": version,
           "SERVING_CA_CERTIFICATE": ca if ca.endswith("\n") else ca + "\n", "UNIT": BCD_UNIT}
    for name, value in raw.items():
        text = text.replace(f"@{name}@", value)
    for name, value in quoted.items():
        text = text.replace(f"=@{name}@\n", f"={shlex.quote(value)}\n")
    left = re.search(r"@[A-Z_0-9]+@", text)
    if left is not None:  # a template and its filler out of step: a bug, not bad input
        raise RuntimeError(f"install script template placeholder {left.group()} not filled")
    return text


def install_script(ctx: Context, a: argparse.Namespace) -> None:
    if a.out:
        check_new_file(a.out)
    digests = parse_digests(a.sha256)
    version = check_version(a.bcd_version)
    base_url = check_url(a.base_url, "--base-url", schemes=("https", "http"))
    gateway_url = (check_url(a.gateway_url, "--gateway-url", schemes=("https",))
                   if a.gateway_url else None)
    site = ctx.call("sites.get", siteId=a.site)
    pool = ctx.call("pools.get", poolId=a.pool)
    if pool["siteId"] != site["id"]:
        raise InvalidInput(
            f"pool {pool['id']} is on site {pool['siteId']}, not {site['id']}: pass that pool's "
            "site with --site"
        )
    script = render_script(pool=pool["id"], site=site["id"], base_url=base_url,
                           gateway_url=gateway_url, version=version, digests=digests,
                           pki=ctx.call("pki.show"))
    if not a.out:
        sys.stdout.write(script)
        return
    try:
        fd = os.open(a.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:
        raise Conflict(f"--out {a.out} already exists; it is never overwritten") from None
    with os.fdopen(fd, "w") as f:
        f.write(script)
    arches = ", ".join(sorted(digests))
    print(f"wrote {Path(a.out)}: installs bcd {version} ({arches}) from {base_url} and joins "
          f"pool {pool['id']}; run it as root with the join token on standard input: "
          f"sudo sh {Path(a.out).name} < join-token", file=sys.stderr)


_EXAMPLE = ("better-compute daemon install-script --pool $POOL --site $SITE --base-url "
            "https://compute.example.com --bcd-version 0.1.0 --sha256 amd64=$(sha256sum "
            "dist/bcd_0.1.0_linux_amd64 | cut -d' ' -f1) --out install-bcd.sh")


def register(sub: Any) -> None:
    g = add_group(sub, "daemon", "bcd, the node agent: the install script.",
                  examples=[_EXAMPLE])
    p = add_verb(g, "install-script", install_script,
                 "Generate install-bcd.sh: downloads and verifies bcd, writes its config with "
                 "the pins, runs bcd doctor and bcd join, enables bcd.service.", output=False,
                 examples=["scripts/build-bcd      # prints dist/bcd_0.1.0_linux_amd64 <sha256>",
                           _EXAMPLE])
    p.add_argument("--pool", required=True, metavar="POOL", help="the pool the machines join")
    p.add_argument("--site", required=True, metavar="SITE", help="the pool's site")
    p.add_argument("--gateway-url", metavar="URL",
                   help="the agents' gateway (https://gw.example.com:8443); default: what the "
                   "server's well-known document publishes")
    p.add_argument("--base-url", required=True, metavar="URL",
                   help="the control plane the machine downloads bcd from and joins "
                   "(https://compute.example.com)")
    p.add_argument("--bcd-version", required=True, metavar="V",
                   help="the version in the download's name bcd_<V>_linux_<arch>")
    p.add_argument("--sha256", required=True, nargs="+", action="extend", metavar="ARCH=HEX",
                   help="the SHA-256 of each architecture's bcd: amd64=HEX [arm64=HEX]")
    p.add_argument("--out", metavar="FILE",
                   help="write the script to FILE (never overwritten); default: standard output")
