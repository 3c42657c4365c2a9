"""A server killed with SIGKILL loses nothing acknowledged and books nothing twice.

Right after a create: the create was acknowledged, so it is in the store; on restart the same
--key returns the same object and no second one exists. And while clients create: six
clients reserve with keys, without pause, through a worker killed with SIGKILL (the server
exits with status 1) and then the whole server killed with SIGKILL, each restarted on its
port; a call that fails in transit is sent again with its key. After the last restart every
acknowledged reservation is in the store as it was answered, every key names at most one
reservation, no GPU is booked twice, and `store verify` is clean.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from better_compute.domain.access import LOCAL_OPERATOR as OP
from tests.booking_checks import assert_booked_once_within_quota
from tests.fleet import add_nodes, make_pool
from tests.outage import api_client, rpc_call
from tests.support import (
    VENV_BIN,
    cli_inprocess,
    client_env,
    eventually,
    free_port,
    initialize,
    open_runtime,
    run,
    serve,
)

POLICY = '{"acceptance": [{"kind": "diag.nvml"}], "expect": {"gpuCount": 8}}'


def _cli(env: dict[str, str], *argv: str, cwd: Path) -> str:
    shell = {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', os.defpath)}"}
    result = run(["better-compute", *argv], shell, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_same_key_same_object_after_sigkill(env: dict[str, str], tmp_path: Path) -> None:
    token = initialize(env)
    (tmp_path / "pool-policy.json").write_text(POLICY)
    site_argv = ["sites", "create", "--kind", "shared", "--region", "eu-1", "--key", "site-eu-1",
                 "--query", "id"]

    def pool_argv(site: str) -> list[str]:
        return ["pools", "create", "--site", site, "--class", "metal-host", "--gpu-model", "H100",
                "--policy-file", "pool-policy.json", "--key", "pool-eu-1-h100", "--query", "id"]

    with serve(env) as server:
        cli = client_env(env, server, token)
        site = _cli(cli, *site_argv, cwd=tmp_path)
        pool = _cli(cli, *pool_argv(site), cwd=tmp_path)
        server.kill(signal.SIGKILL)
        assert server.process.returncode == -signal.SIGKILL
    assert site.startswith("site_") and pool.startswith("pool_")

    with serve(env) as server:
        cli = client_env(env, server, token)
        assert _cli(cli, *site_argv, cwd=tmp_path) == site
        assert _cli(cli, *pool_argv(site), cwd=tmp_path) == pool
        sites = json.loads(_cli(cli, "sites", "list", cwd=tmp_path))
        pools = json.loads(_cli(cli, "pools", "list", cwd=tmp_path))
        # A retry with other parameters is still a conflict after the restart.
        shell = {**cli, "PATH": f"{VENV_BIN}{os.pathsep}{cli.get('PATH', os.defpath)}"}
        clash = run(["better-compute", *site_argv[:5], "eu-2", *site_argv[6:]], shell)
        server.kill(signal.SIGKILL)
    assert [s["id"] for s in sites] == [site]
    assert [p["id"] for p in pools] == [pool]
    assert clash.returncode == 6 and "different parameters" in clash.stderr  # conflict


CLIENTS = 6


class Creators:
    """Clients that create reservations without pause, each key sent again until answered."""

    def __init__(self, url: str, ca: Path, tokens: list[str], pool: str) -> None:
        self.url, self.ca, self.tokens, self.pool = url, ca, tokens, pool
        self.acked: dict[str, dict[str, Any]] = {}  # key -> the answer
        self.sent: set[str] = set()
        self.refused: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True)
                        for n in range(len(tokens))]

    def run(self, n: int) -> None:
        with api_client(self.url, self.ca, timeout=30) as http:
            for i in range(10_000):
                key = f"c{n}-{i}"
                while not self.stop.is_set():
                    with self.lock:
                        self.sent.add(key)
                    out = rpc_call(http, self.tokens[n], "reservations.create",
                                   {"poolId": self.pool, "gpus": 1, "duration": "1h",
                                    "key": key})
                    if out.error is None:
                        with self.lock:
                            self.acked[key] = out.result
                        break
                    if out.error in ("no_capacity", "quota_exceeded", "conflict"):
                        with self.lock:
                            self.refused.append(out.error)
                        break
                    self.stop.wait(0.1)  # in transit, or the server going down: again
                if self.stop.is_set():
                    return

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def more(self, than: int, what: str) -> None:
        eventually(lambda: self.count() >= than + 3, f"clients create again after {what}",
                   timeout=120)


def test_acknowledged_creates_survive_sigkill_of_a_worker_and_of_serve_mid_load(
        env: dict[str, str]) -> None:
    initialize(env)
    runtime = open_runtime(env)
    try:
        pool = make_pool(runtime.service)
        nodes = add_nodes(runtime.service, pool, 40)  # 320 GPUs: no create is refused
        tokens = [runtime.service.tokens_create(OP, None, "admin", f"c{n}")["token"]
                  for n in range(CLIENTS)]
    finally:
        runtime.close()
    ca = Path(env["BETTER_COMPUTE_DATA_DIR"]) / "serving-ca.pem"
    port = free_port()
    creators = Creators(f"https://127.0.0.1:{port}", ca, tokens, pool)
    try:
        with serve(env, "--workers", "2", port=port) as server:
            for thread in creators.threads:
                thread.start()
            creators.more(0, "the start")
            workers = [int(c) for c in Path(f"/proc/{server.process.pid}/task/"
                                            f"{server.process.pid}/children").read_text().split()]
            before = creators.count()
            os.kill(workers[0], signal.SIGKILL)  # calls in flight on it are cut
            assert server.process.wait(timeout=60) == 1  # a dead worker stops the server
        with serve(env, "--workers", "2", port=port) as server:
            creators.more(before, "a worker was killed")
            before = creators.count()
            server.kill(signal.SIGKILL)
            assert server.process.returncode == -signal.SIGKILL
        with serve(env, "--workers", "2", port=port):
            creators.more(before, "serve was killed")
            creators.stop.set()
            for thread in creators.threads:
                thread.join(60)
    finally:
        creators.stop.set()
    assert creators.refused == []
    runtime = open_runtime(env)
    try:
        stored = {r["key"]: r for r in runtime.services.reservations.list(
            OP, None, pool, None)}
        for key, answer in creators.acked.items():  # every acknowledged one, as answered
            assert key in stored, f"acknowledged {key} ({answer['id']}) is not in the store"
            assert (stored[key]["id"], stored[key]["gpus"]) == (answer["id"], answer["gpus"])
        assert set(stored) <= creators.sent  # nothing nobody asked for; one per key
        assert len({r["id"] for r in stored.values()}) == len(stored)
        assert_booked_once_within_quota(runtime.store, pool, nodes, list(stored.values()),
                                        "acme", 0, 320)
    finally:
        runtime.close()
    assert len(creators.acked) >= 9
    code, out, err = cli_inprocess(["store", "verify", "--output", "json"], env)
    assert code == 0 and json.loads(out)["ok"], out + err  # read models equal their rebuild
