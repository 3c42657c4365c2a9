"""scripts/run prints what a person needs for the console, and it works as printed.

docs/console.md sends a new user to scripts/run's output for the console's address, the
command that prints the root administrator's token, and the serving CA to trust. Run as a
person runs it (on free ports, with a fresh data folder): the token that command prints signs
in at that address, over TLS verified with that CA file alone.
"""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
from pathlib import Path

import httpx

from tests.support import eventually, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_run_prints_the_console_the_token_command_and_the_ca(tmp_path: Path) -> None:
    api_port, gateway_port = free_port(), free_port()
    data = tmp_path / "data"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path),
           "BC_API_PORT": str(api_port), "BC_GATEWAY_PORT": str(gateway_port),
           "BETTER_COMPUTE_DATA_DIR": str(data)}
    printed = tmp_path / "run.out"
    with printed.open("w") as out:
        process = subprocess.Popen([str(ROOT / "scripts" / "run")], cwd=tmp_path, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
    try:
        eventually(lambda: "serving https://" in printed.read_text() or process.poll() is not None,
                   "scripts/run serves", timeout=120)
        text = printed.read_text()
        assert process.poll() is None, text[-3000:]
        url = f"https://localhost:{api_port}/console"
        assert f"The console, in a browser (docs/console.md): {url}\n" in text
        [command] = re.findall(r"^ +(cat \S+/root-token)$", text, re.M)
        assert command == f"cat {data}/root-token"
        [ca] = re.findall(r"^ +(\S+/serving-ca\.pem)$", text, re.M)
        assert "ERR_CERT_AUTHORITY_INVALID" in text

        token = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                               check=True).stdout.strip()
        assert token.startswith("biam_")
        with httpx.Client(verify=ssl.create_default_context(cafile=ca), timeout=30) as client:
            page = client.get(url)  # verified with the printed CA, and nothing else
            assert page.status_code == 200 and "<title>better-compute console" in page.text
            me = client.post(f"https://localhost:{api_port}/api/compute/rpc",
                             headers={"Authorization": f"Bearer {token}"},
                             json={"jsonrpc": "2.0", "id": 1, "method": "system.whoami"}).json()
            assert me["result"]["tenantId"] == "root" and me["result"]["rootAdministrator"]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=60)
