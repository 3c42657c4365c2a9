"""CDI specs for holds: ``BCD_ROOT/etc/cdi/bcd-alloc_<id>.json``, one file per allocation.

A hold's spec has kind ``bcd.dev/gpu`` and one device per held GPU, named by the
GPU's UUID (``bcd.dev/gpu=GPU-…``). When NVIDIA's own spec is on the node (see
:data:`VENDOR_SPEC_CANDIDATES`), each device carries the device nodes, mounts and
hooks of exactly that GPU, copied from the vendor device with the same UUID (or
the same index: nvidia-ctk names devices by index and UUID), and the vendor
spec's top-level edits (control devices, driver libraries, hooks) become the hold
spec's top-level edits. Without a vendor spec every device carries only
``NVIDIA_VISIBLE_DEVICES``.

Rules this module keeps (shared/reference/node-facts.md, docs/cdi.md):

- ``cdiVersion`` is the lowest version whose fields the spec uses
  (:func:`required_version`), because runtimes refuse a file that uses a field
  newer than its version, and older runtimes refuse newer versions.
- Only the fields CDI defines are copied; runtimes refuse unknown fields.
- One GPU is named in one bcd-alloc_*.json at a time: two files of one folder
  that define the same device name make runtimes drop that device.
- Every file is written atomically (temp file in the same folder, fsync, rename).

The functions that build specs are pure; those that touch files say so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .files import write_atomic
from .gpu.model import Inventory
from .paths import Paths

KIND = "bcd.dev/gpu"
SPEC_PREFIX = "bcd-"
SPEC_SUFFIX = ".json"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

# Where NVIDIA's spec is looked for, first found wins. /etc/cdi/nvidia.json is what the
# tutorial has the operator generate (and what the container-toolkit unit writes);
# toolkit 1.18+ also writes /var/run/cdi/nvidia.yaml on its own.
VENDOR_SPEC_CANDIDATES = (
    "etc/cdi/nvidia.json",
    "etc/cdi/nvidia.yaml",
    "var/run/cdi/nvidia.json",
    "var/run/cdi/nvidia.yaml",
)

ALLOCATION_ID = re.compile(r"^alloc_[A-Za-z0-9]{1,64}\Z")
# CDI device names: letters, digits and _ - . : inside, alphanumeric at both ends.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")

# The fields CDI defines, per object; anything else in a vendor spec is dropped.
_EDIT_FIELDS = (
    "env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt", "netDevices",
)
_DEVICE_NODE_FIELDS = (
    "path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid",
)
_MOUNT_FIELDS = ("hostPath", "containerPath", "type", "options")
_HOOK_FIELDS = ("hookName", "path", "args", "env", "timeout")
_NET_DEVICE_FIELDS = ("hostInterfaceName", "name")


class VendorSpecError(Exception):
    """NVIDIA's spec is on the node but cannot be used; the message says how to fix it."""


class MissingVendorDevice(Exception):
    """The vendor spec describes no device for a held GPU."""

    def __init__(self, uuid: str, vendor_path: Path) -> None:
        super().__init__(
            f"{uuid} is not described in the vendor CDI spec {vendor_path} (neither by UUID "
            "nor by index): regenerate it with `nvidia-ctk cdi generate --format=json "
            "--device-name-strategy=uuid > /etc/cdi/nvidia.json`"
        )
        self.uuid = uuid


@dataclass(frozen=True)
class VendorSpec:
    """NVIDIA's spec as read from disk; ``fingerprint`` changes whenever the file does."""

    path: Path
    document: Mapping[str, Any]
    fingerprint: str


def device_name(uuid: str) -> str:
    """The fully qualified CDI name of a held GPU: ``bcd.dev/gpu=GPU-…``."""
    return f"{KIND}={uuid}"


def is_valid_device_name(name: str) -> bool:
    return bool(_DEVICE_NAME.match(name))


def check_allocation_id(allocation_id: str) -> str:
    """Refuse ids that would escape the folder or nest the slice (a dash is a slice level)."""
    if not ALLOCATION_ID.match(allocation_id):
        raise ValueError(
            f"{allocation_id!r} is not an allocation id: expected alloc_ followed by letters "
            "and digits (no dashes, no slashes)"
        )
    return allocation_id


def spec_path(paths: Paths, allocation_id: str) -> Path:
    return paths.cdi / f"{SPEC_PREFIX}{check_allocation_id(allocation_id)}{SPEC_SUFFIX}"


# -- reading the vendor spec ------------------------------------------------------------


def find_vendor_spec(paths: Paths) -> Path | None:
    for relative in VENDOR_SPEC_CANDIDATES:
        candidate = paths.under(relative)
        if candidate.is_file():
            return candidate
    return None


def read_vendor_spec(paths: Paths) -> VendorSpec | None:
    """NVIDIA's spec, or None when the node has none. Raises VendorSpecError when unusable."""
    path = find_vendor_spec(paths)
    if path is None:
        return None
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise VendorSpecError(f"cannot read the vendor CDI spec {path}: {error}") from None
    try:
        # JSON is YAML, but json is faster and gives better messages for .json files.
        document = json.loads(raw) if path.suffix == ".json" else yaml.safe_load(raw)
    except (ValueError, yaml.YAMLError) as error:
        raise VendorSpecError(
            f"the vendor CDI spec {path} is not valid {path.suffix[1:].upper()}: {error}; "
            "regenerate it with `nvidia-ctk cdi generate`"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("devices"), list):
        raise VendorSpecError(
            f"the vendor CDI spec {path} has no `devices` list; regenerate it with "
            "`nvidia-ctk cdi generate`"
        )
    return VendorSpec(path, document, hashlib.sha256(str(path).encode() + b"\0" + raw).hexdigest())


def vendor_fingerprint(paths: Paths) -> str | None:
    """A hash of the vendor spec's path and bytes (None without one); cheap to poll."""
    path = find_vendor_spec(paths)
    if path is None:
        return None
    try:
        return hashlib.sha256(str(path).encode() + b"\0" + path.read_bytes()).hexdigest()
    except OSError:
        return None


# -- deriving a hold spec (pure) --------------------------------------------------------


def _pick(value: Any, fields: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {}
    return {name: value[name] for name in fields if value.get(name) not in (None, "", [], {})}


def clean_edits(edits: Any) -> dict[str, Any]:
    """Only the CDI-defined fields of a containerEdits object, empty ones left out."""
    if not isinstance(edits, Mapping):
        return {}
    out: dict[str, Any] = {}
    if edits.get("env"):
        out["env"] = [str(item) for item in edits["env"]]
    for name, fields in (("deviceNodes", _DEVICE_NODE_FIELDS), ("mounts", _MOUNT_FIELDS),
                         ("hooks", _HOOK_FIELDS), ("netDevices", _NET_DEVICE_FIELDS)):
        items = [_pick(item, fields) for item in edits.get(name) or ()]
        if items := [item for item in items if item]:
            out[name] = items
    if edits.get("additionalGids"):
        out["additionalGids"] = list(edits["additionalGids"])
    if isinstance(edits.get("intelRdt"), Mapping):
        out["intelRdt"] = dict(edits["intelRdt"])
    return {name: out[name] for name in _EDIT_FIELDS if name in out}


def _vendor_devices(vendor: VendorSpec, inventory: Inventory) -> dict[str, Mapping[str, Any]]:
    """The vendor device of each GPU UUID, matched by name = UUID first, then by index."""
    by_name = {
        str(device.get("name")): device
        for device in vendor.document.get("devices") or ()
        if isinstance(device, Mapping)
    }
    found: dict[str, Mapping[str, Any]] = {}
    for gpu in inventory.gpus:
        device = by_name.get(gpu.uuid) or by_name.get(str(gpu.index))
        if device is not None:
            found[gpu.uuid] = device
    return found


def derive_hold_spec(
    gpus: Sequence[str], inventory: Inventory, vendor: VendorSpec | None
) -> dict[str, Any]:
    """The spec of a hold of exactly ``gpus`` (UUIDs, in the order given).

    Raises MissingVendorDevice when a vendor spec exists but describes none of a
    held GPU's devices. Without a vendor spec each device sets
    ``NVIDIA_VISIBLE_DEVICES`` to every held UUID: CDI refuses a device with no
    edits, and when a container asks for several devices the last env value wins,
    so each device must carry the whole hold's list, not just its own UUID.
    """
    devices: list[dict[str, Any]] = []
    top: dict[str, Any] = {}
    if vendor is None:
        visible = f"{VISIBLE_DEVICES}={','.join(gpus)}"
        devices = [{"name": uuid, "containerEdits": {"env": [visible]}} for uuid in gpus]
    else:
        matched = _vendor_devices(vendor, inventory)
        for uuid in gpus:
            device = matched.get(uuid)
            edits = clean_edits(device.get("containerEdits")) if device is not None else {}
            if not edits:
                raise MissingVendorDevice(uuid, vendor.path)
            devices.append({"name": uuid, "containerEdits": edits})
        top = clean_edits(vendor.document.get("containerEdits"))
    spec: dict[str, Any] = {"cdiVersion": "", "kind": KIND, "devices": devices}
    if top:
        spec["containerEdits"] = top
    spec["cdiVersion"] = required_version(spec)
    return spec


def _all_edits(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    edits = [device.get("containerEdits") or {} for device in spec.get("devices") or ()]
    return [*edits, spec.get("containerEdits") or {}]


def required_version(spec: Mapping[str, Any]) -> str:
    """The lowest ``cdiVersion`` that supports every field ``spec`` uses.

    Mirrors MinimumRequiredVersion in cncf-tags/container-device-interface
    (specs-go/version.go, requiresV040..V070) plus node-facts.md's 1.1.0 rule for
    netDevices. The floor is 0.3.0, the earliest version runtimes still accept.

    On "a dot in the class" (0.6.0): CDI splits ``kind`` into ``vendor/class`` at the
    slash (parseQualifier) and requiresV060 only looks at the part AFTER it
    ("The v0.6.0 spec allows dots "." in Kind name label (class)"). The vendor part
    was always a DNS-like name with dots (``nvidia.com``), so ``bcd.dev/gpu`` (class
    ``gpu``) does not need 0.6.0.
    """
    edits = _all_edits(spec)
    if any(edit.get("netDevices") for edit in edits):
        return "1.1.0"
    if any(edit.get("intelRdt") is not None or edit.get("additionalGids") for edit in edits):
        return "0.7.0"
    devices = list(spec.get("devices") or ())
    _, _, klass = str(spec.get("kind", "")).partition("/")
    if spec.get("annotations") or any(d.get("annotations") for d in devices) or "." in klass:
        return "0.6.0"
    if any(not _starts_with_letter(str(d.get("name", ""))) for d in devices) or any(
        node.get("hostPath") for edit in edits for node in edit.get("deviceNodes") or ()
    ):
        return "0.5.0"
    if any(mount.get("type") for edit in edits for mount in edit.get("mounts") or ()):
        return "0.4.0"
    return "0.3.0"


def _starts_with_letter(name: str) -> bool:
    """CDI's IsLetter: ASCII letters only (names starting otherwise need 0.5.0)."""
    return bool(name) and ("a" <= name[0] <= "z" or "A" <= name[0] <= "Z")


def spec_gpus(spec: Mapping[str, Any]) -> list[str]:
    """The GPU UUIDs a hold spec names (its device names)."""
    return [str(device.get("name")) for device in spec.get("devices") or () if device.get("name")]


def render(spec: Mapping[str, Any]) -> bytes:
    """The bytes written for ``spec``: stable, so binding twice writes the same file."""
    return (json.dumps(spec, indent=2) + "\n").encode()


# -- hold spec files ----------------------------------------------------------------------


def read_holds(paths: Paths) -> dict[str, list[str]]:
    """Allocation id -> the GPU UUIDs its bcd-alloc_*.json names, for every hold on disk.

    A file that cannot be parsed is listed with no GPUs: it still belongs to bcd and
    is rewritten or removed like any other.
    """
    holds: dict[str, list[str]] = {}
    if not paths.cdi.is_dir():
        return holds
    for path in sorted(paths.cdi.glob(f"{SPEC_PREFIX}alloc_*{SPEC_SUFFIX}")):
        allocation_id = path.name[len(SPEC_PREFIX):-len(SPEC_SUFFIX)]
        if not ALLOCATION_ID.match(allocation_id):
            continue
        try:
            holds[allocation_id] = spec_gpus(json.loads(path.read_bytes()))
        except (OSError, ValueError, AttributeError):
            holds[allocation_id] = []
    return holds


def write_hold_spec(paths: Paths, allocation_id: str, spec: Mapping[str, Any]) -> bool:
    """Write the hold's spec atomically; False (nothing written) when it is already on disk."""
    path = spec_path(paths, allocation_id)
    payload = render(spec)
    with contextlib.suppress(OSError):
        if path.read_bytes() == payload:
            return False
    write_atomic(path, payload, mode=0o644)
    return True


def remove_hold_spec(paths: Paths, allocation_id: str) -> bool:
    """Remove the hold's spec; False when there was none (release is idempotent)."""
    try:
        spec_path(paths, allocation_id).unlink()
    except FileNotFoundError:
        return False
    return True


@dataclass
class RefreshResult:
    """What :func:`refresh_all` did to each hold spec on disk."""

    rewritten: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # allocation id -> why its spec was kept as it was (the hold is never dropped)
    kept: dict[str, str] = field(default_factory=dict)


def refresh_all(paths: Paths, inventory: Inventory) -> RefreshResult:
    """Re-derive every hold spec from the vendor spec as it is now.

    The agent calls this when :func:`vendor_fingerprint` changes (a driver upgrade
    regenerates nvidia.json with new library paths). A hold whose spec cannot be
    re-derived (its GPU vanished from the vendor spec, or the vendor spec is broken)
    keeps its current file: bcd never drops a hold on its own.
    """
    result = RefreshResult()
    holds = read_holds(paths)
    if not holds:
        return result
    try:
        vendor = read_vendor_spec(paths)
    except VendorSpecError as error:
        result.kept = {allocation_id: str(error) for allocation_id in holds}
        return result
    for allocation_id, gpus in holds.items():
        if not gpus:
            result.kept[allocation_id] = "its spec file is unreadable; it is rewritten on bind"
            continue
        try:
            spec = derive_hold_spec(gpus, inventory, vendor)
        except MissingVendorDevice as error:
            result.kept[allocation_id] = str(error)
            continue
        if write_hold_spec(paths, allocation_id, spec):
            result.rewritten.append(allocation_id)
        else:
            result.unchanged.append(allocation_id)
    return result


class VendorWatch:
    """Tells the agent when the vendor spec changed since it last looked."""

    def __init__(self, paths: Paths) -> None:
        self._paths = paths
        self._seen = vendor_fingerprint(paths)

    def changed(self) -> bool:
        now = vendor_fingerprint(self._paths)
        if now == self._seen:
            return False
        self._seen = now
        return True
