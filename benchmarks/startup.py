"""Start-up of the command lines, as a person types them: medians beside ``python -c pass``.

    .venv/bin/python -m better_compute.benchmarks.startup [--runs 15]

Sets up a real control plane in a temp dir (``init``, ``serve`` over TLS with the agents'
gateway, a site, a pool, a join token) and one simulated GPU server (``bcd join`` and
``bcd node`` under its own BCD_ROOT with the fake GPU source), then times, each ``--runs``
times in turn, as real processes:

- ``python -c pass`` (the same interpreter: the floor every command pays),
- ``better-compute --help``,
- ``better-compute api system.whoami`` against the server (a remote call: TLS, one RPC),
- ``bcd --help``,
- ``bcd status --json`` against the running agent (its unix socket).

Prints the median and the ratio to ``python -c pass`` for each, with the load average
(this machine is shared: ratios are steadier than milliseconds). The goals
(docs/performance.md): ``--help`` under 3x, a remote call under 4x, ``bcd status --json``
under 3x. Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from better_compute.benchmarks.harness import free_port

BIN = Path(sys.executable).parent
CLI, BCD = str(BIN / "better-compute"), str(BIN / "bcd")
GOALS = {"better-compute --help": 3.0, "better-compute api system.whoami": 4.0,
         "bcd status --json": 3.0}


def _run(argv: list[str], env: dict[str, str], **kwargs: object) -> str:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return str(done.stdout).strip()


def _wait_line(process: subprocess.Popen[str], needle: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        if needle in line:
            return
    raise SystemExit(f"no {needle!r} from {process.args!r}")


@contextmanager
def _cluster(folder: Path) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """A served store with one adopted-or-adopting node whose bcd runs; yields the operator's
    and the GPU server's environments."""
    data = folder / "data"
    base = {"PATH": os.environ.get("PATH", ""), "HOME": str(folder),
            "BETTER_COMPUTE_DATA_DIR": str(data)}
    token = _run([CLI, "init"], base).splitlines()[-1]
    port, gw = free_port(), free_port()
    processes: list[subprocess.Popen[str]] = []
    try:
        server = subprocess.Popen([CLI, "serve", "--listen", f"127.0.0.1:{port}", "--hostname",
                                   "localhost", "--gateway-listen", f"127.0.0.1:{gw}"],
                                  env=base, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        processes.append(server)
        _wait_line(server, "serving ")
        operator = {**base, "BETTER_COMPUTE_URL": f"https://localhost:{port}",
                    "BETTER_COMPUTE_TOKEN": token, "BETTER_COMPUTE_TENANT": "root",
                    "BETTER_COMPUTE_CA_FILE": str(data / "serving-ca.pem")}
        site = _run([CLI, "sites", "create", "--kind", "shared", "--region", "eu-1",
                     "--query", "id"], operator)
        (folder / "policy.json").write_text('{"acceptance": [], "expect": {"gpuCount": 8}}')
        pool = _run([CLI, "pools", "create", "--site", site, "--class", "metal-host",
                     "--gpu-model", "H100", "--policy-file", str(folder / "policy.json"),
                     "--query", "id"], operator)
        _run([CLI, "join-tokens", "create", "--pool", pool, "--ttl", "1h",
              "--out", str(folder / "join-token")], operator)
        pins = json.loads(_run([CLI, "pki", "show", "-o", "json"], operator))
        root = folder / "node"
        gpus = folder / "gpus.json"
        _run([sys.executable, "-c", "import sys; from better_compute.agent.gpu import "
              "write_fake_fleet_file as w; w(sys.argv[1], serial='SN-1')", str(gpus)], base)
        node = {"PATH": base["PATH"], "HOME": str(folder), "BCD_ROOT": str(root),
                "BCD_GPU_SOURCE": f"fake:{gpus}"}
        _run([BCD, "join", "--server", f"https://localhost:{port}/api/compute",
              "--serving-ca-pin", pins["servingCaSpkiPin"],
              "--join-signing-pin", pins["joinSigningKeyPin"],
              "--join-encryption-pin", pins["joinEncryptionKeyPin"],
              "--token-file", str(folder / "join-token")], node)
        agent = subprocess.Popen([BCD, "node"], env=node, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True)
        processes.append(agent)
        _wait_line(agent, "session connected")
        yield operator, node
    finally:
        for process in reversed(processes):
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            if process.poll() is None:
                process.kill()
                process.wait()


def _time_ms(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=60, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="runs of each command (default 15)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bc-startup-") as tmp, \
            _cluster(Path(tmp)) as (operator, node):
        commands = {
            "python -c pass": ([sys.executable, "-c", "pass"], operator),
            "better-compute --help": ([CLI, "--help"], operator),
            "better-compute api system.whoami": ([CLI, "api", "system.whoami"], operator),
            "bcd --help": ([BCD, "--help"], node),
            "bcd status --json": ([BCD, "status", "--json"], node),
        }
        for command, env in commands.values():  # warm the page cache and the .pyc files
            _time_ms(command, env)
        load_before = os.getloadavg()
        # Round-robin, so a busy spell on this shared machine weighs on every command alike.
        samples: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, (command, env) in commands.items():
                samples[name].append(_time_ms(command, env))
        medians = {name: statistics.median(times) for name, times in samples.items()}
        load_after = os.getloadavg()
    floor = medians["python -c pass"]
    print(f"start-up medians of {args.runs} runs (load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after)")
    failed = False
    for name, ms in medians.items():
        goal = GOALS.get(name)
        verdict = ""
        if goal is not None:
            ok = ms / floor < goal
            failed = failed or not ok
            verdict = f"  goal < {goal:g}x: {'met' if ok else 'MISSED'}"
        print(f"  {name:<36} {ms:7.1f} ms  {ms / floor:4.1f}x{verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
