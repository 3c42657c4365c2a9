"""`bcd status`: read the running agent over its unix socket, with the standard library only.

Kept apart from the agent itself so that `bcd status` imports neither the agent, anyio,
httpx nor cryptography: it is a command people run often, by hand and from scripts.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys
from pathlib import Path
from typing import TextIO

from ..errors import BcdError
from ..paths import Paths
from .unix_path import reachable

STATUS_PATH = "/v1/status"  # served by status_server.py


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("bcd", timeout=timeout)
        self._socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            with reachable(Path(self._socket_path)) as address:
                sock.connect(address)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _unreachable(path: Path, why: str, code: str = "unavailable") -> BcdError:
    return BcdError(f"cannot read the running agent at {path}: {why}", code=code)


def fetch_status(socket_path: Path) -> dict[str, object]:
    if not socket_path.exists():
        raise BcdError(
            f"bcd node is not running: there is no socket at {socket_path}. Start it "
            "(systemctl start bcd, or bcd node --config /etc/bcd/config.toml)",
            code="unavailable")
    if not os.access(socket_path, os.R_OK | os.W_OK):
        raise _unreachable(socket_path, "permission denied; run it as root (sudo bcd status)",
                           "permission_denied")
    conn = _UnixConnection(str(socket_path), timeout=10.0)
    try:
        conn.request("GET", STATUS_PATH)
        response = conn.getresponse()
        body = response.read()
    except (ConnectionRefusedError, FileNotFoundError):
        raise _unreachable(socket_path, "nothing answers (bcd node is not running; start "
                           "it with systemctl start bcd)") from None
    except (OSError, http.client.HTTPException) as exc:
        raise _unreachable(socket_path, f"{exc or type(exc).__name__}; is bcd node hung? "
                           "see its log") from None
    finally:
        conn.close()
    if response.status != 200:
        raise _unreachable(socket_path, f"it answered HTTP {response.status}")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise _unreachable(socket_path, "it answered something other than a status object")
    return data


def status_command(*, paths: Paths, as_json: bool, socket: str | None = None,
                   out: TextIO = sys.stdout) -> int:
    status = fetch_status(Path(socket) if socket else paths.socket)
    if as_json:
        out.write(json.dumps(status, indent=2) + "\n")
    else:
        from .render import render_status

        out.write(render_status(status))
    return 0
