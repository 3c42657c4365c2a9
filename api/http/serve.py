"""``better-compute serve``: uvicorn with TLS from the serving CA."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from ssl import SSLContext
from typing import Any

import anyio
import uvicorn
from uvicorn.config import STARTUP_FAILURE

from better_compute.api import pki, run_files
from better_compute.api.controllers.runner import run_controllers
from better_compute.api.http import http_limits, introspect, listener
from better_compute.api.http.app import LifespanTask, build_app
from better_compute.api.http.metrics import publish_state
from better_compute.api.http.request_log import RequestFields
from better_compute.api.http.server_config import with_file
from better_compute.api.http.watch import stop_streams
from better_compute.api.http.workers import bind, listening_socket
from better_compute.api.net import Handshakes, is_loopback
from better_compute.api.runtime import Runtime
from better_compute.api.settings import env_count, env_networks, env_seconds
from better_compute.api.store.token_use import flush_token_use
from better_compute.api.wire import logs
from better_compute.api.wire.daemon import notify
from better_compute.domain.errors import InvalidInput
from better_compute.domain.placement import NodePartition

log = logging.getLogger("better_compute.serve")

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
# At shutdown (SIGTERM), calls in flight have the grace (BETTER_COMPUTE_SHUTDOWN_GRACE,
# SHUTDOWN_GRACE seconds by default) to be answered. Then the connections still open are
# ended (aborted): their callers get no answer, so nothing unanswered counts as
# acknowledged, and a save under way still ends (its thread is never abandoned). Should a
# call outlive that by CANCEL_AFTER seconds, uvicorn cancels it (a bug: it logs an error).
# A shutdown still going after SLOW_SHUTDOWN_REPORT seconds (half the grace if shorter)
# logs what it waits on (api/http/introspect.py).
SHUTDOWN_GRACE = 15.0
CANCEL_AFTER = 5
SLOW_SHUTDOWN_REPORT = 5.0
# Before all that, for BETTER_COMPUTE_SHUTDOWN_DRAIN seconds (none by default), the server
# drains: it serves on, but /ready answers 503 and every answer closes its connection, so a
# load balancer moves new calls to other replicas first (docs/high-availability.md).
SHUTDOWN_DRAIN = 0.0


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InvalidInput(f"--listen {text!r} is not HOST:PORT (for example 127.0.0.1:8443)")
    return host.strip("[]"), int(port)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    listen: str
    hostnames: list[str]
    insecure_loopback: bool = False
    gateway_url: str | None = None
    log_level: str = "warning"
    gateway_listen: str | None = None
    log_format: str = "text"
    metrics_listen: str | None = None  # loopback HOST:PORT for GET /metrics without a token
    workers: int = 1  # processes serving the API on one socket (api/http/workers.py)
    workers_from_default: bool = False  # ``workers`` is the core count, not --workers


class _Server(uvicorn.Server):
    """Announces readiness on stdout once the socket is bound, so callers never sleep.

    Should the application's lifespan ever end while serving (its background tasks are
    supervised, so only a bug ends it), the server exits with status 1 instead of
    serving on without its store: a service manager starts it again.
    """

    def __init__(self, config: uvicorn.Config, ready_line: str, grace: float, *,
                 handshake_timeout: float, handshakes: Handshakes, drain: float = 0.0) -> None:
        config.timeout_graceful_shutdown = math.ceil(grace) + CANCEL_AFTER
        super().__init__(config)
        self.ready_line = ready_line
        self.grace = grace
        self.drain = drain
        self.handshake_timeout = handshake_timeout
        self.handshakes = handshakes
        self.lifespan_died = False

    async def on_tick(self, counter: int) -> bool:
        if self.started and getattr(self.lifespan, "error_occurred", False) \
                and not self.lifespan_died:
            self.lifespan_died = True
            log.critical(
                "the application's lifespan ended while serving; stopping (exit status 1)")
            self.should_exit = True
        return await super().on_tick(counter)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None or self.config.ssl is None:  # plain HTTP: the loop's own listener
            await super().startup(sockets)
        else:
            await self._start_tls(sockets)
        if self.started:
            introspect.report_on_signal(self.describe)  # kill -USR1: what it waits on
            print(self.ready_line, flush=True)
            notify("READY=1")  # Type=notify under systemd; nothing otherwise

    async def _start_tls(self, sockets: list[socket.socket]) -> None:
        """uvicorn's start on the sockets it is given, each served by a ``TlsListener``
        (api/http/listener.py) instead of the loop's ``create_server``."""
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state,
                _loop=_loop)

        self.servers = [listener.TlsListener(loop, create_protocol, sock, config.ssl,  # type: ignore[misc]
                                             self.handshake_timeout, self.handshakes)
                        for sock in sockets]
        self.started = True

    def describe(self) -> str:
        """One line: stopping or not, open connections, calls in flight (introspect.py)."""
        return (f"pid {os.getpid()}, {'stopping' if self.should_exit else 'serving'}, "
                f"{len(self.server_state.connections)} connection(s) open, "
                f"{len(self.server_state.tasks)} call(s) in flight")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        notify("STOPPING=1")
        await self._drain()
        # uvicorn waits for open responses before the lifespan ends: end the
        # /watch streams first (readers reconnect and resume), or it would wait forever.
        stop_streams(self.config.app)()
        await self._hand_back_agents()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._report_if_slow)
            tg.start_soon(self._end_calls_after_grace)
            await super().shutdown(sockets)
            tg.cancel_scope.cancel()

    def _state(self) -> Any:
        return getattr(getattr(self.config.app, "state", None), "bc", None)

    async def _drain(self) -> None:
        """Serve on for ``drain`` seconds with /ready at 503 and every answer closing its
        connection (app.py ``CloseWhenStopping``), while the listener still accepts: a load
        balancer's health checks take this replica out of rotation meanwhile, and clients
        reconnect through it to the others. A second signal ends the wait."""
        state = self._state()
        if state is not None:
            state.stopping = True
        if self.drain <= 0:
            return
        log.warning("stopping: draining for %gs (/ready answers 503, calls are still served, "
                    "each answer closes its connection)", self.drain)
        deadline = time.monotonic() + self.drain
        while time.monotonic() < deadline and not self.force_exit:
            await anyio.sleep(0.1)

    async def _hand_back_agents(self) -> None:
        """End the agents' sessions this replica holds (the gateway's, where it runs here):
        each agent reconnects, through the load balancer, to another replica."""
        state = self._state()
        gateway = state.extra.get("gateway") if state is not None else None
        if gateway is not None:
            await gateway.hand_back()

    async def _report_if_slow(self) -> None:
        after = min(SLOW_SHUTDOWN_REPORT, self.grace / 2)
        await anyio.sleep(after)
        log.warning("still stopping %gs after the signal (calls still running %gs after it "
                    "are ended unanswered): %s; %s", after, self.grace, self.describe(),
                    introspect.tasks_report())

    async def _end_calls_after_grace(self) -> None:
        await anyio.sleep(self.grace)
        connections = list(self.server_state.connections)
        if connections:
            log.warning("ending %d connection(s) still open %gs after the signal; their "
                        "calls in flight are not answered", len(connections), self.grace)
        for connection in connections:
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()


def tls_files(runtime: Runtime, hostnames: list[str]) -> tuple[Path, Path]:
    """A fresh serving certificate and key, as the files uvicorn reads (``read_once`` removes
    them once read); first those that processes killed meanwhile left (api/run_files.py)."""
    bundle = pki.unseal_bundle(runtime.service.pki().sealed,
                               pki.parse_master_key(runtime.master_key_text()))
    cert_pem, key_pem = pki.issue_serving_certificate(bundle, hostnames)
    run_dir = runtime.data_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    run_files.remove_stale(run_dir)
    cert_path, key_path = run_dir / f"serving-{os.getpid()}.crt", run_dir / f"serving-{os.getpid()}.key"
    for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
        run_files.write_private(path, data)
    return cert_path, key_path


def read_once(config: uvicorn.Config, default: Callable[[], SSLContext]) -> SSLContext:
    """uvicorn's own TLS context (its ``ssl_context_factory``, with its defaults) from the
    serving files, which are removed as soon as it has read them: the key is on disk only
    until the server holds it in memory, whatever way the process ends later."""
    try:
        return default()
    finally:
        for path in (config.ssl_certfile, config.ssl_keyfile):
            if path:
                Path(path).unlink(missing_ok=True)


def _gateway(options: ServeOptions, gateway_url: str | None) -> tuple[str, LifespanTask]:
    """The gateway's lifespan task and the URL to publish (``--gateway-url`` wins)."""
    from better_compute.api.gateway.lifespan import gateway_task

    text = options.gateway_listen or ""
    g_host, sep, g_port = text.rpartition(":")
    if not sep or not g_port.isdigit() or not g_host:
        raise InvalidInput(
            f"--gateway-listen {text!r} is not HOST:PORT (for example 0.0.0.0:8444)")
    g_host = g_host.strip("[]")
    names = list(dict.fromkeys(options.hostnames + (list(LOOPBACK_NAMES)
                                                    if is_loopback(g_host) else [])))
    if not names:
        raise InvalidInput(
            "--hostname is needed with --gateway-listen: name the host names nodes use to reach "
            "the gateway (for example --hostname gw.eu-1.example.com)")
    if not gateway_url:
        public = g_host if g_host not in ("0.0.0.0", "::") else names[0]
        gateway_url = f"https://{f'[{public}]' if ':' in public else public}:{g_port}"
    return gateway_url, gateway_task(g_host, int(g_port), names)


def _metrics_listener(text: str) -> tuple[str, LifespanTask]:
    """The loopback /metrics listener's lifespan task and its URL (docs/metrics.md); its
    socket is bound here, so a port in use stops the server at once with one line."""
    from better_compute.api.wire.daemon import bind_scrape, serve_scrape

    host, port = _metrics_address(text)
    try:
        sock = bind_scrape(host, port, "--metrics-listen")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None

    async def run(state: Any, *, task_status: Any) -> None:
        metrics = state.extra["metrics"]

        async def render() -> bytes:
            return bytes(await anyio.to_thread.run_sync(metrics.render, limiter=state.limiter))

        await serve_scrape(sock, render, task_status=task_status)

    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics", run


def _metrics_address(text: str) -> tuple[str, int]:
    """``--metrics-listen``'s HOST:PORT, refused unless it is a loopback address."""
    from better_compute.api.wire.daemon import parse_listen as parse_address

    try:
        host, port = parse_address(text, "--metrics-listen")
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    if not is_loopback(host):
        raise InvalidInput(
            f"--metrics-listen serves /metrics without a token, so on loopback only; {host} "
            "is not a loopback address: use 127.0.0.1:PORT for a Prometheus on this host, "
            "or scrape GET /metrics on the API with a root-tenant token")
    return host, port


def _tls(options: ServeOptions, runtime: Runtime, host: str
         ) -> tuple[str, list[str], dict[str, Any]]:
    """The scheme, the certificate's host names and uvicorn's TLS settings (none on plain
    HTTP): the files and ``read_once``, which removes them once read."""
    if options.insecure_loopback:
        if not is_loopback(host):
            raise InvalidInput(
                f"--insecure-loopback serves plain HTTP, which is allowed on loopback only; "
                f"{host} is not a loopback address: drop the flag to serve TLS"
            )
        return "http", [], {}
    loopback = list(LOOPBACK_NAMES) if is_loopback(host) else []
    names = list(dict.fromkeys(options.hostnames + loopback))
    if not names:
        raise InvalidInput(
            "--hostname is needed: name the host names clients use to reach this server "
            "(for example --hostname compute.example.com); they go into its certificate"
        )
    cert, key = tls_files(runtime, names)
    return "https", names, {"ssl_certfile": str(cert), "ssl_keyfile": str(key),
                            "ssl_context_factory": read_once}


def _lifespan_tasks(primary: bool, gateway: tuple[str, LifespanTask] | None,
                    gateway_url: str | None, metrics: tuple[str, LifespanTask] | None,
                    worker: bool = False, gateway_here: bool | None = None
                    ) -> tuple[list[LifespanTask], str]:
    """The app's lifespan tasks for this worker, and what the ready line says of them.
    ``gateway_here``: this worker serves the gateway (by default the primary does)."""
    tasks: list[LifespanTask] = [run_controllers, flush_token_use] if primary \
        else [flush_token_use]
    if worker:  # one of --workers: its state gauges, for scrapes other workers answer
        tasks.append(publish_state)
    notes = ""
    if gateway is not None:
        notes = f"; gateway {gateway_url} (mutual TLS)"
    if gateway is not None and (primary if gateway_here is None else gateway_here):
        tasks.append(gateway[1])  # the other workers publish its URL only
    if metrics is not None:
        tasks.append(metrics[1])
        notes += f"; metrics {metrics[0]}"
    return tasks, notes


def _workers_that_fit(options: ServeOptions, settings: Mapping[str, str]) -> ServeOptions:
    """On PostgreSQL: as many workers as its max_connections holds (api/store/pg_capacity.py).
    ``settings``: the environment with the config file's (``with_file``)."""
    from better_compute.api.store.store import StoreConfig

    config = StoreConfig.from_env(settings)
    if config.backend != "postgres":
        return options
    from better_compute.api.store.pg_capacity import check_workers

    workers = check_workers(config, options.workers, from_default=options.workers_from_default)
    return dataclasses.replace(options, workers=workers)


def trusted_proxies(env: Mapping[str, str] | None) -> list[str]:
    """``http.trusted_proxies``: the peers whose X-Forwarded-For names the client."""
    return env_networks(env, "BETTER_COMPUTE_HTTP_TRUSTED_PROXIES", "http.trusted_proxies")


def _uvicorn(app: Any, options: ServeOptions, ssl: dict[str, str], env: Mapping[str, str],
             ready: str) -> _Server:
    """The uvicorn server of ``app``, with the edge's bounds (api/http/listener.py), its
    timeouts and grace."""
    head_timeout = env_seconds(env, "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT", listener.HEAD_TIMEOUT)
    metrics = getattr(getattr(app, "state", None), "metrics", None)
    limits = listener.ConnectionLimits(
        total=env_count(env, "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS", listener.MAX_CONNECTIONS),
        per_address=env_count(env, "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS_PER_ADDRESS",
                              listener.MAX_CONNECTIONS_PER_ADDRESS),
        on_open=metrics.connections.set if metrics is not None else None,
        on_refused=metrics.connection_refused if metrics is not None else None)
    handshakes = Handshakes(
        total=env_count(env, "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES", listener.MAX_HANDSHAKES),
        per_address=env_count(env, "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES_PER_ADDRESS",
                              listener.MAX_HANDSHAKES_PER_ADDRESS),
        on_refused=metrics.connection_refused if metrics is not None else None)
    proxies = trusted_proxies(env)
    protocol = listener.protocol(limits, head_timeout, env_seconds(
        env, "BETTER_COMPUTE_HTTP_SEND_TIMEOUT", listener.SEND_TIMEOUT))
    config = uvicorn.Config(app, log_level=options.log_level,
                            log_config=None,  # our handler and format (logs.configure)
                            access_log=False, lifespan="on",
                            # X-Forwarded-For only from the proxies named (uvicorn's
                            # default believes it from loopback: any local process)
                            proxy_headers=bool(proxies), forwarded_allow_ips=proxies or [],
                            http=protocol,  # type: ignore[arg-type]  # a factory, not a class
                            ws="none",  # no upgrade: a connection stays a listener.Connection
                            **ssl)  # type: ignore[arg-type]
    return _Server(config, ready,
                   env_seconds(env, "BETTER_COMPUTE_SHUTDOWN_GRACE", SHUTDOWN_GRACE),
                   handshake_timeout=head_timeout, handshakes=handshakes,
                   drain=env_seconds(env, "BETTER_COMPUTE_SHUTDOWN_DRAIN", SHUTDOWN_DRAIN))


def serve(options: ServeOptions, env: dict[str, str] | None = None, *, fd: int | None = None,
          worker_index: int = 0, worker_count: int = 1) -> None:
    """Serve until a signal. ``fd``: a worker of ``--workers`` on its parent's socket (worker
    ``worker_index`` of ``worker_count``); only worker 0 runs the controllers and the /metrics
    listener, and only the last worker the gateway (with one worker, the same process;
    api/http/workers.py). Each worker packs its own partition of nodes first
    (domain/placement.py)."""
    logs.configure(options.log_level, options.log_format,
                   filters=[RequestFields(), http_limits.ClientNoise()])
    host, port = parse_listen(options.listen)
    if options.workers < 1:
        raise InvalidInput(f"--workers {options.workers}: use 1 or more processes")
    settings = with_file(os.environ if env is None else env)  # BETTER_COMPUTE_CONFIG's file
    if fd is None:  # the server's process, not a worker of it
        trusted_proxies(settings)  # refused here, once, before any worker starts
        options = _workers_that_fit(options, settings)
    if options.workers > 1 and fd is None:
        from better_compute.api.http.workers import supervise

        if options.metrics_listen:  # refused here once, not by a worker after the others start
            _metrics_address(options.metrics_listen)
        if options.gateway_listen:
            _gateway(options, None)
        supervise(options, env, host, port)
        return
    primary = worker_index == 0
    metrics = _metrics_listener(options.metrics_listen) \
        if options.metrics_listen and primary else None
    env = settings
    gateway_url = options.gateway_url or env.get("BETTER_COMPUTE_GATEWAY_URL") or None
    gateway = _gateway(options, gateway_url) if options.gateway_listen else None
    if gateway is not None:
        gateway_url = gateway[0]
    partition = NodePartition(worker_index, worker_count) if worker_count > 1 else None
    runtime = Runtime.open(env, gateway_url=gateway_url, partition=partition)
    runtime.service.pki()  # refuses early, with the fix, when `init` has not run
    scheme, names, ssl = _tls(options, runtime, host)
    tasks, notes = _lifespan_tasks(primary, gateway, gateway_url, metrics, fd is not None,
                                   gateway_here=worker_index == worker_count - 1)
    app = build_app(runtime, tasks=tasks)
    shown = f"[{host}]" if ":" in host else host
    ready = (f"serving {scheme}://{shown}:{port}/api/compute on {runtime.config.describe()}"
             + (f" (certificate for {', '.join(names)})" if names else " (plain HTTP, loopback only)")
             + notes)
    server = _uvicorn(app, options, ssl, env, ready)
    try:
        # A worker serves on its parent's socket, as the TCP socket it is (not uvicorn's
        # ``fd=``, which reads it as a Unix socket and leaves Nagle on: workers.py).
        server.run(sockets=[bind(host, port) if fd is None else listening_socket(fd)])
    finally:  # a start that failed before uvicorn read them
        for setting in ("ssl_certfile", "ssl_keyfile"):
            if setting in ssl:
                Path(ssl[setting]).unlink(missing_ok=True)
    if not server.started or server.lifespan_died:
        sys.exit(1)
