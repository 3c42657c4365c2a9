"""Test helpers for the node side of holds: a BCD_ROOT with GPUs, vendor specs, CDI checks.

Factories only: each test builds its own root under its tmp_path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from better_compute.agent.gpu import Inventory, write_fake_fleet_file
from better_compute.agent.paths import Paths

FIXTURES = Path(__file__).parent / "fixtures"
VENDOR_H100X8 = FIXTURES / "cdi" / "nvidia-h100x8.json"
SCHEMA_DIR = FIXTURES / "cdi-schema"

# Every field CDI defines, per object: runtimes refuse the rest, and the JSON schema
# does not say so (it has no additionalProperties: false), so tests check it here.
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "spec": frozenset({"cdiVersion", "kind", "annotations", "devices", "containerEdits"}),
    "device": frozenset({"name", "annotations", "containerEdits"}),
    "edits": frozenset({"env", "deviceNodes", "mounts", "hooks", "additionalGids", "intelRdt",
                        "netDevices"}),
    "deviceNodes": frozenset({"path", "hostPath", "type", "major", "minor", "fileMode",
                              "permissions", "uid", "gid"}),
    "mounts": frozenset({"hostPath", "containerPath", "type", "options"}),
    "hooks": frozenset({"hookName", "path", "args", "env", "timeout"}),
    "netDevices": frozenset({"hostInterfaceName", "name"}),
}


def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry: Registry = Registry().with_resource(
        "defs.json", Resource.from_contents(defs, default_specification=DRAFT7)
    )
    return jsonschema.Draft7Validator(schema, registry=registry)


_VALIDATOR = _validator()


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def minimum_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion the spec's fields need, by node-facts.md's rules.

    Written independently of agent/cdi.py (a table of rules, not its branches) so a
    test can catch a wrong version there.
    """
    edits = [d.get("containerEdits", {}) for d in spec.get("devices", [])]
    edits.append(spec.get("containerEdits", {}))
    devices = spec.get("devices", [])
    klass = spec["kind"].split("/", 1)[1]
    rules = [
        ("0.4.0", any("type" in m for e in edits for m in e.get("mounts", []))),
        ("0.5.0", any("hostPath" in n for e in edits for n in e.get("deviceNodes", []))),
        ("0.5.0", any(not d["name"][:1].isascii() or not d["name"][:1].isalpha()
                      for d in devices)),
        ("0.6.0", bool(spec.get("annotations")) or any(d.get("annotations") for d in devices)),
        ("0.6.0", "." in klass),
        ("0.7.0", any(e.get("additionalGids") or "intelRdt" in e for e in edits)),
        ("1.1.0", any(e.get("netDevices") for e in edits)),
    ]
    needed = [version for version, used in rules if used]
    return max(needed, key=_version_tuple, default="0.3.0")


def check_cdi_spec(spec: Mapping[str, Any]) -> None:
    """Fail unless ``spec`` validates against the official schema, uses only CDI fields,
    and declares a cdiVersion no lower than its fields need."""
    _VALIDATOR.validate(spec)
    _only_known(spec, "spec")
    for device in spec["devices"]:
        _only_known(device, "device")
        _check_edits(device["containerEdits"])
        assert device["containerEdits"], f"device {device['name']} has no edits (CDI refuses it)"
    _check_edits(spec.get("containerEdits", {}))
    declared = _version_tuple(spec["cdiVersion"])
    needed = minimum_version(spec)
    assert declared >= _version_tuple(needed), f"cdiVersion {spec['cdiVersion']} < {needed}"


def _only_known(value: Mapping[str, Any], kind: str) -> None:
    extra = set(value) - KNOWN_FIELDS[kind]
    assert not extra, f"{kind} has fields CDI does not define: {sorted(extra)}"


def _check_edits(edits: Mapping[str, Any]) -> None:
    _only_known(edits, "edits")
    for name in ("deviceNodes", "mounts", "hooks", "netDevices"):
        for item in edits.get(name, []):
            _only_known(item, name)


def node_root(tmp_path: Path, *, gpus: int = 8, cpus: int = 224,
              memory_gib: float = 2015.56) -> tuple[Paths, Inventory]:
    """A BCD_ROOT with etc/cdi and run/bcd, and the fake 8-GPU H100 host SN-7701.

    Its GPU UUIDs are the ones VENDOR_H100X8 describes.
    """
    root = tmp_path / "root"
    (root / "etc" / "cdi").mkdir(parents=True)
    inventory = write_fake_fleet_file(tmp_path / "fake-gpus.json", gpus=gpus, cpus=cpus,
                                      memory_gib=memory_gib)
    return Paths(root), inventory


def install_vendor_spec(paths: Paths, *, fmt: str = "json",
                        document: Mapping[str, Any] | None = None) -> Path:
    """Put NVIDIA's spec where nvidia-ctk writes it: /etc/cdi/nvidia.json, or
    /var/run/cdi/nvidia.yaml (what toolkit 1.18+ writes on its own) for ``fmt="yaml"``."""
    if fmt == "json":
        target = paths.under("etc/cdi/nvidia.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        if document is None:
            shutil.copyfile(VENDOR_H100X8, target)
        else:
            target.write_text(json.dumps(document, indent=2))
    else:
        target = paths.under("var/run/cdi/nvidia.yaml")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(document or vendor_document(), sort_keys=False))
    return target


def vendor_document() -> Any:  # the parsed JSON, unchecked
    return json.loads(VENDOR_H100X8.read_text())


def read_json(path: Path | str) -> Any:  # the parsed JSON, unchecked
    return json.loads(Path(path).read_text())


def source_env_file(path: Path | str, names: Sequence[str]) -> dict[str, str]:
    """What ``set -a; . FILE`` exports in POSIX sh, for ``names``."""
    script = "set -a; . \"$1\"; set +a; " + "; ".join(
        f'printf "%s=%s\\n" {name} "${name}"' for name in names
    )
    done = subprocess.run(["sh", "-c", script, "sh", str(path)], capture_output=True, text=True,
                          check=True, timeout=10)
    return dict(line.split("=", 1) for line in done.stdout.splitlines())


CTK_ARGS = "cdi generate --format=json --device-name-strategy=uuid"


def fake_nvidia_ctk(folder: Path, output: Path = VENDOR_H100X8, exit_code: int = 0) -> Path:
    """A stand-in for NVIDIA's nvidia-ctk at the hardware edge, like the fake GPU source.

    Put ``folder`` first on the PATH of bcd. Minimal on purpose: for exactly the arguments
    the container-toolkit unit passes it prints ``output`` (by default the spec nvidia-ctk
    gives the simulated H100 server SN-7701) and exits ``exit_code``; it appends its
    arguments to ``folder/nvidia-ctk.log``, one run per line. Returns the log's path.
    """
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "nvidia-ctk.log"
    script = folder / "nvidia-ctk"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        f'[ "$*" = "{CTK_ARGS}" ] || {{ echo "nvidia-ctk: unexpected arguments: $*" >&2; exit 2; }}\n'
        f'cat "{output}"\n'
        f"exit {exit_code}\n"
    )
    script.chmod(0o755)
    return log
