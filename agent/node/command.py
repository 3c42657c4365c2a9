"""`bcd node` and `bcd status`: the composition root of the running agent, and its reader.

`bcd node` reads config.toml, the node key and the GPU source, takes the agent lock
(BCD_ROOT/var/lib/bcd/lock: one agent per machine), and runs :class:`NodeAgent` until
SIGTERM or SIGINT, then exits 0 and removes its socket; when the control plane says the
node was removed, it says so and exits 3 (``RestartPreventExitStatus=3`` in its unit). Progress goes to standard
output, one ``bcd node: ...`` line each; ``bcd node: session connected (epoch N)`` is
the ready line.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from typing import TextIO

import anyio

from better_compute.api.wire import logs
from better_compute.api.wire.daemon import bind_scrape, notify, parse_listen

from ..errors import BcdError
from ..gpu import GpuSourceError, open_source
from ..paths import Paths
from .agent import NodeAgent, NodeOptions
from .settings import load_settings, resolve_config_path
from .state import state_dir
from .status_client import fetch_status, status_command

__all__ = ["fetch_status", "node_command", "status_command"]  # status: see status_client.py


@contextlib.contextmanager
def _agent_lock(paths: Paths) -> Iterator[None]:
    folder = state_dir(paths)
    folder.mkdir(parents=True, exist_ok=True, mode=0o750)
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BcdError(
                f"another bcd node is already running on this machine (it holds {folder}/lock): "
                "stop it first (systemctl stop bcd), or read it with `bcd status`",
                code="conflict"
            ) from None
        yield
    finally:
        os.close(fd)


async def _until_signal(agent: NodeAgent) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with anyio.create_task_group() as group:
            await group.start(agent.run)
            notify("READY=1")  # Type=notify under systemd: the status socket is up

            async def stop() -> None:
                async for received in signals:
                    notify("STOPPING=1")
                    agent.say(f"stopping ({signal.Signals(received).name})")
                    group.cancel_scope.cancel()
                    return

            async def removed() -> None:
                assert agent.stop_requested is not None
                await agent.stop_requested.wait()
                group.cancel_scope.cancel()

            group.start_soon(stop)
            group.start_soon(removed)


def _metrics_address(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    try:
        return parse_listen(text, "--metrics-listen", default_host="127.0.0.1")
    except ValueError as exc:
        raise BcdError(str(exc)) from None


def _metrics_socket(address: tuple[str, int] | None) -> socket.socket | None:
    try:
        return bind_scrape(*address, "--metrics-listen") if address else None
    except ValueError as exc:
        raise BcdError(str(exc)) from None


def _log_format(text: str | None) -> str:
    if text not in (None, *logs.FORMATS):
        raise BcdError(f"log format {text!r} ([log] format of config.toml) is not text or json",
                       code="invalid_input")
    return text or "text"


def node_command(config: str | None, *, paths: Paths, env: Mapping[str, str],
                 out: TextIO = sys.stdout, options: NodeOptions | None = None,
                 log_format: str | None = None, metrics_listen: str | None = None) -> int:
    settings = load_settings(resolve_config_path(config, paths))
    log_format = _log_format(log_format or settings.log_format)
    logs.configure("warning", log_format, out)  # libraries' warnings, in the same format
    metrics_at = _metrics_address(metrics_listen or settings.metrics_listen)
    key = settings.load_key()
    metrics_socket = _metrics_socket(metrics_at)  # bound now: a port in use is one line
    settings.ssl_context()  # refuse a broken identity now, not on every reconnect
    try:
        source = open_source(env.get("BCD_GPU_SOURCE"), host_root=str(paths.root))
    except GpuSourceError as exc:
        raise BcdError(f"cannot open the GPU source: {exc}") from None
    try:
        with _agent_lock(paths):
            options = options or NodeOptions(out=out, log_format=log_format,
                                             metrics_socket=metrics_socket)
            agent = NodeAgent(settings, paths, source, key, options=options)
            agent.say(f"starting as {settings.identity.node_id} (GPU source {source.name})")
            anyio.run(_until_signal, agent)
            agent.say("stopped")
            if agent.removed is not None:
                raise NodeRemovedError(agent.removed)
    finally:
        source.close()
    return 0


class NodeRemovedError(BcdError):
    """Exit status 3 (``not_found``): the node was removed; the systemd unit does not restart
    bcd then."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="not_found")

