"""`serve` as systemd runs it: a config file, the shipped unit, refusals that name the fix.

Real processes: `better-compute serve --config FILE` takes its listen address, store, log
format and metrics listener from the file; the environment beats the file; a metrics
listener off loopback is refused. `server-unit` prints the unit that runs exactly that.
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import httpx

from tests.support import CLI, cli_inprocess, free_port, initialize, run, store_env, wait_for_line


def test_serve_reads_its_settings_from_the_config_file(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    initialize(env)
    api, metrics = free_port(), free_port()
    config = tmp_path / "server.toml"
    config.write_text(f'listen = "127.0.0.1:{api}"\ninsecure_loopback = true\n'
                      f'[store]\ndata_dir = "{tmp_path / "elsewhere"}"\n'
                      f'[log]\nformat = "json"\nlevel = "info"\n'
                      f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    # BETTER_COMPUTE_DATA_DIR in the environment beats the file's store.data_dir.
    process = subprocess.Popen([CLI, "serve", "--config", str(config)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ready = wait_for_line(process, "serving ")
        assert f"http://127.0.0.1:{api}/api/compute on SQLite {env['BETTER_COMPUTE_DATA_DIR']}" \
            in ready
        assert f"metrics http://127.0.0.1:{metrics}/metrics" in ready
        answer = httpx.post(f"http://127.0.0.1:{api}/api/compute/rpc", json={
            "jsonrpc": "2.0", "id": 1, "method": "system.whoami", "params": {}}, timeout=30)
        assert answer.json()["error"]["data"]["code"] == "unauthenticated"
        scraped = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=30).text
        assert 'better_compute_rpc_requests_total{code="unauthenticated",method="system.whoami"}' \
            in scraped
        assert httpx.get(f"http://127.0.0.1:{metrics}/other", timeout=30).status_code == 404
    finally:
        process.terminate()
        process.wait(timeout=60)
    lines = [json.loads(line) for line in (process.stderr.read() if process.stderr else
                                           "").splitlines() if line.startswith("{")]
    assert any(line["logger"] == "better_compute.request" and line["code"] == "unauthenticated"
               and line["tenant"] is None for line in lines)
    assert not (tmp_path / "elsewhere").exists()


def test_refusals_name_the_setting(tmp_path: Path) -> None:
    env = store_env("sqlite", tmp_path)
    # Each run names its own free --listen: serve never falls back to the default 8443,
    # which another server on this machine may hold (its refusal would name --listen).
    listen = ["--listen", f"127.0.0.1:{free_port()}"]
    off_loopback = run([CLI, "serve", *listen, "--metrics-listen", "0.0.0.0:9464"], env)
    assert off_loopback.returncode == 2  # a bad value: usage (cli/exit_codes.py)
    assert "--metrics-listen serves /metrics without a token, so on loopback only" in \
        off_loopback.stderr
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        in_use = run([CLI, "serve", *listen, "--metrics-listen", f"127.0.0.1:{port}"], env)
    assert in_use.returncode == 2
    assert in_use.stderr.strip() == (f"error [invalid_input]: --metrics-listen 127.0.0.1:{port}: cannot listen "
                                     "there (Address already in use); pick a free port")
    config = tmp_path / "bad.toml"
    config.write_text('[metrics]\nlisen = "127.0.0.1:1"\n')
    typo = run([CLI, "serve", *listen, "--config", str(config)], env)
    assert typo.returncode == 2
    assert f"{config}: unknown setting 'metrics.lisen' (did you mean metrics.listen?)" in \
        typo.stderr


def test_server_unit_runs_serve_with_the_config_under_systemd() -> None:
    code, unit, _ = cli_inprocess(["server-unit"], {})
    assert code == 0
    service = unit.split("[Service]", 1)[1].split("[Install]", 1)[0]
    assert "Type=notify\n" in service and "NotifyAccess=main\n" in service
    assert "ExecStart=/usr/local/bin/better-compute serve --config " \
           "/etc/better-compute/server.toml\n" in service
    assert "User=better-compute\n" in service and "StateDirectory=better-compute\n" in service
    assert "WantedBy=multi-user.target" in unit
