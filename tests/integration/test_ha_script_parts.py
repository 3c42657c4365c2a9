"""``scripts/ha``'s view of the parts it starts: a process it started is running until it
ends, whatever its command line shows meanwhile, and one that ends while it starts is
reported with how it ended.

The kernel closes the exec pipe that ``subprocess.Popen`` waits on a moment before the new
program's command line is readable (``/proc/PID/cmdline`` is empty in between): on a loaded
machine, a part checked by its command line right after its start looked "not running"
beside an empty log (CI: etcd; here: HAProxy). The tests stand a process whose command line
never names the layout in for that window."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def ha() -> ModuleType:
    spec = importlib.util.spec_from_file_location("scripts_ha", REPO / "scripts" / "ha.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["scripts_ha"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def layout(ha: ModuleType, tmp_path: Path) -> Iterator[Any]:
    layout = ha.Layout(tmp_path / "layout")
    layout.create(fast=True, env={})
    yield layout
    for process in layout.spawned.values():
        process.kill()
        process.wait()


def test_a_part_this_run_started_runs_while_its_command_line_is_not_readable_yet(
        ha: ModuleType, layout: Any) -> None:
    layout.spawn("etcd", ["sleep", "60"], {"PATH": "/usr/bin:/bin"})
    assert layout.pid("etcd") is None  # its command line does not name the layout
    assert layout.running("etcd")
    checks = iter([False, False, True])
    ha.wait_for(lambda: next(checks), "etcd answers", layout=layout, part="etcd")


def test_a_part_that_ends_while_it_starts_is_reported_with_how_it_ended(
        ha: ModuleType, layout: Any) -> None:
    layout.spawn("etcd", ["sh", "-c", "echo 'starting'; kill -9 $$"], {"PATH": "/usr/bin:/bin"})
    layout.spawned["etcd"].wait()
    with pytest.raises(ha.HaError, match=r"etcd is not running \(killed by SIGKILL\)"
                                         r"\netcd's log ends:\nstarting"):
        ha.wait_for(lambda: False, "etcd answers", layout=layout, part="etcd")
    layout.spawn("haproxy", ["sh", "-c", "exit 3"], {"PATH": "/usr/bin:/bin"})
    layout.spawned["haproxy"].wait()
    with pytest.raises(ha.HaError, match=r"haproxy is not running \(exited with status 3\)"):
        ha.wait_for(lambda: False, "HAProxy answers", layout=layout, part="haproxy")
