"""Many short-lived child processes that each run a script, without each importing the product.

A test that starts dozens of ``python -c SCRIPT`` processes spent most of its time importing
better_compute in each (about a second of CPU apiece). ``Forker`` is one process that imports
the modules once and then forks a child per script: each child is still a separate process
with its own store connections (the forker never opens one), so a child may be killed,
SIGKILL included, exactly like a process started from scratch, and several forked at once
really run at the same moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from tests.support import wait_for_line

_FORKER = r"""
import importlib, json, os, sys, tempfile, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    children = []
    for argv in request["argvs"]:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        sys.stdout.flush(); sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
            sys.argv = ["-c", *argv]
            code = 0
            try:
                exec(compile(request["script"], "<child>", "exec"), {"__name__": "__main__"})
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
        children.append((pid, out, err))
    answers = []
    for pid, out, err in children:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        texts = []
        for f in (out, err):
            f.seek(0); texts.append(f.read().decode(errors="replace")); f.close()
        answers.append([status, *texts])
    print(json.dumps(answers), flush=True)
"""


@dataclass
class Child:
    """What ``subprocess.run`` would have answered for one child."""

    returncode: int
    stdout: str
    stderr: str


class Forker:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process

    def run(self, script: str, *argvs: Sequence[str], timeout: float = 120) -> list[Child]:
        """Fork one child per ``argvs`` entry (its ``sys.argv[1:]``), all at once; wait for
        every one of them."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"script": script,
                                             "argvs": [list(a) for a in argvs]}) + "\n")
        self.process.stdin.flush()
        line = wait_for_line(self.process, "", timeout=timeout)
        return [Child(*answer) for answer in json.loads(line)]


@contextlib.contextmanager
def forker(env: Mapping[str, str], *modules: str) -> Iterator[Forker]:
    """A forker with ``env`` as its (and its children's) environment, ``modules`` imported."""
    process = subprocess.Popen([sys.executable, "-c", _FORKER, *modules], env=dict(env),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_line(process, "ready", timeout=120)
        yield Forker(process)
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        with contextlib.suppress(ProcessLookupError):  # a child left behind by a failure
            os.killpg(process.pid, signal.SIGKILL)
