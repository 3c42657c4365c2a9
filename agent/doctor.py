"""`bcd doctor`: check what a join and a running node need, and say what to fix.

Each check prints one line, ``OK``, ``FAIL`` or ``SKIP``, with what it found; a
failure adds the fix on the next line. The exit status is 1 when any check failed.
Checks: privileges (root, or a writable BCD_ROOT), config.toml, the GPU source,
the server (reachable, serving the pinned CA), the clock (against the server's
HTTP Date), and once joined the node's certificate.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from cryptography import x509

from . import config as config_file
from .config import AgentConfig
from .control_plane import Fetched, ca_pin, fetch_unverified, normalize_server
from .errors import BcdError
from .hardware import read_inventory
from .paths import Paths

MAX_CLOCK_SKEW = timedelta(seconds=60)
# A clock before this is certainly wrong (no bcd existed then): certificates would not verify.
EARLIEST_SANE = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # OK, FAIL or SKIP
    detail: str
    fix: str | None = None


def _ok(name: str, detail: str) -> Check:
    return Check(name, "OK", detail)


def _fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, "FAIL", detail, fix)


def _writable_dir(path: Path) -> bool:
    """Whether ``path`` or, where it does not exist yet, its nearest parent is writable."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return os.access(probe, os.W_OK | os.X_OK)


def check_privileges(paths: Paths) -> Check:
    if os.geteuid() == 0:
        return _ok("privileges", "running as root")
    targets = [paths.etc, paths.cdi, paths.run]
    blocked = [str(path) for path in targets if not _writable_dir(path)]
    if paths.root == Path("/") or blocked:
        where = ", ".join(blocked) if blocked else "/etc/bcd, /etc/cdi, /run/bcd"
        return _fail("privileges", f"not root, and cannot write {where}",
                     "run bcd as root (sudo bcd ...), or set BCD_ROOT to a folder you can write")
    return _ok("privileges", f"BCD_ROOT {paths.root} is writable")


def check_config(paths: Paths) -> tuple[Check, AgentConfig | None]:
    try:
        existing = config_file.load(paths.config)
    except BcdError as exc:
        return _fail("config", str(exc), f"fix or remove {paths.config}"), None
    if existing is None:
        return _ok("config", f"{paths.config} not written yet (bcd join writes it)"), None
    if existing.node is not None:
        return _ok("config", f"{paths.config}: joined as {existing.node.id}"), existing
    return _ok("config", f"{paths.config}: not joined yet"), existing


def check_gpus(paths: Paths, env: Mapping[str, str]) -> Check:
    try:
        inventory = read_inventory(paths, env)
    except BcdError as exc:
        return _fail("GPU source", str(exc),
                     "install the NVIDIA driver (NVML, nvidia-smi) or set BCD_GPU_SOURCE")
    names = sorted({gpu.name for gpu in inventory.gpus})
    unhealthy = [gpu.uuid for gpu in inventory.gpus if not gpu.is_healthy]
    detail = f"{inventory.source}: {len(inventory.gpus)} GPU(s)" + (
        f" ({', '.join(names)})" if names else "")
    if unhealthy:
        detail += f"; unhealthy: {', '.join(unhealthy)}"
    return _ok("GPU source", detail)


def check_server(server: str | None, pin: str | None,
                 fetch: Callable[[str], Fetched]) -> tuple[Check, Fetched | None]:
    if not server:
        return Check("server", "SKIP", "no server configured (pass --server URL)"), None
    try:
        url = normalize_server(server)
        fetched = fetch(url)
    except BcdError as exc:
        return _fail("server", str(exc),
                     "check the URL (it ends in /api/compute), DNS, firewalls and that "
                     "`better-compute serve` runs there"), None
    detail = f"{url} answers the well-known document"
    if pin:
        published = ca_pin(fetched.document.serving_ca_certificate)
        if published != pin:
            return _fail("server", f"{url} serves CA pin {published}, not the pinned {pin}",
                         "check the pin (`better-compute pki show --query servingCaSpkiPin`) "
                         "and that --server names the right control plane"), fetched
        detail += " with the pinned serving CA"
    return _ok("server", detail), fetched


def check_clock(fetched: Fetched | None, now: datetime) -> Check:
    if now < EARLIEST_SANE:
        return _fail("clock", f"the local clock reads {now:%Y-%m-%dT%H:%M:%SZ}",
                     "set the time (timedatectl set-ntp true, or chrony)")
    if fetched is None or fetched.date is None:
        return _ok("clock", f"{now:%Y-%m-%dT%H:%M:%SZ} (not compared: no server Date)")
    skew = now - fetched.date
    seconds = abs(skew.total_seconds())
    if abs(skew) > MAX_CLOCK_SKEW:
        return _fail("clock", f"{seconds:.0f}s off the server's clock",
                     "synchronise the clock (timedatectl set-ntp true, or chrony): certificates "
                     "and signed journal entries depend on it")
    return _ok("clock", f"within {max(seconds, 1):.0f}s of the server's")


def check_certificate(existing: AgentConfig | None, paths: Paths, now: datetime) -> Check | None:
    if existing is None or existing.node is None:
        return None
    path = Path(existing.files.certificate) if existing.files else paths.node_certificate
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        return _fail("certificate", f"cannot read the node certificate {path}: {exc}",
                     "move config.toml away and join again with a new token")
    if cert.not_valid_after_utc <= now:
        return _fail("certificate", f"expired at {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}",
                     "move config.toml away and join again with a new token")
    return _ok("certificate", f"valid until {cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}")


def doctor(*, paths: Paths, env: Mapping[str, str], server: str | None = None,
           out: TextIO = sys.stdout, fetch: Callable[[str], Fetched] = fetch_unverified,
           now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> int:
    checks = [check_privileges(paths)]
    config_check, existing = check_config(paths)
    checks.append(config_check)
    checks.append(check_gpus(paths, env))
    configured = existing.server if existing else None
    target = server or (configured.url if configured else None)
    # The configured pin applies to the configured server, not to another one given by flag.
    same = configured is not None and (server is None or server.rstrip("/") == configured.url)
    pin = configured.serving_ca_pin if same and configured else None
    server_check, fetched = check_server(target, pin, fetch)
    checks.append(server_check)
    checks.append(check_clock(fetched, now()))
    certificate = check_certificate(existing, paths, now())
    if certificate is not None:
        checks.append(certificate)
    for check in checks:
        print(f"{check.status:<4}  {check.name}: {check.detail}", file=out)
        if check.fix:
            print(f"      fix: {check.fix}", file=out)
    failed = [check.name for check in checks if check.status == "FAIL"]
    print(f"{len(failed)} check(s) failed: {', '.join(failed)}" if failed
          else "all checks passed", file=out)
    return 1 if failed else 0
