"""The README's first steps and docs/tutorial.md, every fenced ``sh`` block, run in order.

The docs cannot drift: each block runs as written, in a copy of the repository (so its
``.data/`` and the files the tutorial writes stay there), against real processes:
``scripts/run`` (the control plane and the simulated GPU server), ``bcd node`` and
``better-compute events watch`` run in the background of their terminal; every other block
runs to completion and must exit 0. A block's first line names its terminal
(``# terminal 3: …``); without one it runs in the terminal before. Each terminal keeps its
exports from block to block. The only change made to the text: scripts/run's default ports
(8443 and 8444, a person's) become free ports, through BC_API_PORT and BC_GATEWAY_PORT. A
block marked "not run in this walk" is for another situation and is only checked with
``bash -n``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_port, wait_for_line

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)
TERMINAL = re.compile(r"^# terminal (\d+)")
NOT_RUN = "not run in this walk"
# Commands that keep running, and the line each prints once it is ready.
LONG_RUNNING = {"scripts/run": ("stdout", "serving https://"),
                "bcd node": ("stdout", "session connected"),
                "better-compute events watch": ("stderr", "events watch: following")}


def sh_blocks(path: Path, section: str | None = None) -> list[str]:
    text = path.read_text()
    if section is not None:
        text = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in FENCE.finditer(text)]


def copy_repository(target: Path) -> Path:
    """The tracked (and new, unignored) files, with .venv shared: it must be up to date first,
    or scripts/run's bootstrap in the copy would reinstall the shared .venv from the copy."""
    bootstrap = subprocess.run([str(ROOT / "scripts" / "bootstrap")], cwd=ROOT,
                               capture_output=True, text=True, timeout=900)
    assert bootstrap.returncode == 0, bootstrap.stderr
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    (target / ".venv").symlink_to(ROOT / ".venv")
    stamp = subprocess.run(["sha256sum", "pyproject.toml"], cwd=target, capture_output=True,
                           text=True, check=True).stdout[:16]
    assert (ROOT / ".venv" / f".installed-{stamp}").exists()  # the copy's bootstrap: a no-op
    return target


@dataclass
class Walk:
    repo: Path
    ports: dict[str, str]
    base_env: dict[str, str]
    exports: dict[int, Path] = field(default_factory=dict)
    background: dict[int, subprocess.Popen[str]] = field(default_factory=dict)
    transcript: list[str] = field(default_factory=list)

    def env_file(self, terminal: int) -> Path:
        if terminal not in self.exports:
            path = self.repo.parent / f"terminal-{terminal}.env"
            path.write_text("")
            self.exports[terminal] = path
        return self.exports[terminal]

    def script(self, terminal: int, body: str, *, keep_exports: bool) -> str:
        env_file = self.env_file(terminal)
        save = f"\nexport -p > {env_file}.new && mv {env_file}.new {env_file}\n" \
            if keep_exports else ""
        return f"set -eo pipefail\nsource {env_file}\ncd {self.repo}\n{body}\n{save}"

    def run(self, terminal: int, block: str) -> str:
        for default, port in self.ports.items():
            block = block.replace(default, port)
        lines = block.rstrip("\n").split("\n")
        last = lines[-1].strip()
        long = next((cmd for cmd in LONG_RUNNING if last.startswith(cmd)), None)
        body = "\n".join(lines[:-1]) if long else block
        done = subprocess.run(["bash", "-c", self.script(terminal, body, keep_exports=True)],
                              env=self.base_env, capture_output=True, text=True, timeout=600)
        self.transcript.append(f"--- terminal {terminal} ---\n{block}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, "\n".join(self.transcript[-3:])
        running = self.background.get(terminal)
        if long and (running is None or running.poll() is not None):
            self.start(terminal, long, last)  # (the README and the tutorial both start one)
        return done.stdout

    def start(self, terminal: int, long: str, command: str) -> None:
        stream, ready = LONG_RUNNING[long]
        process = subprocess.Popen(
            ["bash", "-c", self.script(terminal, f"exec {command}", keep_exports=False)],
            env=self.base_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        self.background[terminal] = process
        if stream == "stdout":
            wait_for_line(process, ready, timeout=300)
        else:
            assert process.stderr is not None
            line = process.stderr.readline()
            assert ready in line, f"{command}: {line!r}"

    def stop(self) -> dict[int, str]:
        """Stop every background process (SIGINT: Ctrl-C); returns what each printed."""
        outputs = {}
        for terminal, process in reversed(list(self.background.items())):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            outputs[terminal] = out + err
        return outputs


@pytest.mark.timeout(1200)  # the whole walk, bcd's build included, on a loaded machine
def test_the_readme_and_the_tutorial_run_as_written(tmp_path: Path) -> None:
    readme = sh_blocks(ROOT / "README.md", "First steps")
    tutorial = sh_blocks(ROOT / "docs" / "tutorial.md")
    assert readme and len(tutorial) > 15
    repo = copy_repository(tmp_path / "better-compute")
    api_port, gateway_port = str(free_port()), str(free_port())
    ports = {"localhost:8443": f"localhost:{api_port}", "127.0.0.1:8444": f"127.0.0.1:{gateway_port}"}
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"),
                "BC_API_PORT": api_port, "BC_GATEWAY_PORT": gateway_port,
                "BCD_PYTHONS": python}  # build-bcd for this Python only: the test's time
    walk = Walk(repo, ports, base_env)
    terminal = 1
    try:
        for block in readme + tutorial:
            first = block.split("\n", 1)[0]
            named = TERMINAL.match(first)
            terminal = int(named.group(1)) if named else terminal
            if NOT_RUN in first:
                checked = subprocess.run(["bash", "-n"], input=block, capture_output=True,
                                         text=True, timeout=30)
                assert checked.returncode == 0, (block, checked.stderr)
                continue
            walk.run(terminal, block)
    finally:
        printed = walk.stop()
    text = "\n".join(walk.transcript)
    assert "node.adopted" in text and "adopted" in text
    assert re.search(r"^active$", text, re.M), "reservations get --query state said active"
    assert "bcd.dev/gpu=GPU-" in text  # the hold's CDI spec, read on the GPU server
    assert "BCD_CGROUP_PARENT=bcd-alloc-alloc_" in text  # and its env file
    # Terminal 5 (piped: JSON lines) saw the reservation move, in order.
    seen = [json.loads(line)["type"] for line in printed[5].splitlines() if line.startswith("{")]
    moves = [t for t in seen if t.startswith("reservation.")]
    assert moves == ["reservation.placed", "reservation.binding", "reservation.active",
                     "reservation.released"], seen
    # After every command of the tutorial, the store holds together: every event reads,
    # every aggregate replays, every read model equals its rebuild.
    verified = subprocess.run([str(ROOT / ".venv" / "bin" / "better-compute"), "store", "verify",
                               "--output", "json"],
                              env={**base_env, "BETTER_COMPUTE_DATA_DIR": str(repo / ".data")},
                              capture_output=True, text=True, timeout=600)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
    assert json.loads(verified.stdout)["ok"] is True
