"""Every setting of ``better-compute serve``: flag, environment variable, config file key.

``SETTINGS`` is the one list; docs/configuration.md shows it as one table (a test keeps
them in step, and checks that every ``BETTER_COMPUTE_*`` variable the server reads is
here). ``serve --config FILE`` reads a TOML file whose keys are the settings' keys
(``listen``, ``[store] database_url``, ``[tokens] ttl`` …). Precedence, highest first:
a flag, then the environment variable, then the file, then the default. Unknown keys,
wrong types and values a setting refuses are errors that name the key and the file.

Settings that are environment variables reach the server as its environment: a file
value is used only where the variable is unset, so the server's modules read them one
way, whatever their source.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from better_compute.domain.errors import InvalidInput


@dataclass(frozen=True)
class Setting:
    key: str  # in the config file, dotted: [store] database_url is store.database_url; "" none
    flag: str | None
    env: str | None
    default: str  # as the docs show it
    kind: str  # text | list | bool | choice | duration | number
    meaning: str
    choices: tuple[str, ...] = ()
    fallback: Any = None  # the value a flag's setting has when nothing gives one

    @property
    def dest(self) -> str:
        """The argparse destination of the flag."""
        return (self.flag or "").lstrip("-").replace("-", "_")


_DURATION = "seconds or a duration (30, 30s, 10m, 90d)"

CONFIG_ENV = "BETTER_COMPUTE_CONFIG"
SETTINGS: tuple[Setting, ...] = (
    Setting("", "--config", CONFIG_ENV, "(none)", "text",
            "the TOML file of these settings; the environment variable also serves the "
            "CLI's in-process commands (init, store verify …)"),
    Setting("listen", "--listen", None, "127.0.0.1:8443", "text",
            "the API's address, HOST:PORT", fallback="127.0.0.1:8443"),
    Setting("hostnames", "--hostname", None, "(loopback names on loopback)", "list",
            "names clients use for this server; they go into its certificate", fallback=[]),
    Setting("insecure_loopback", "--insecure-loopback", None, "false", "bool",
            "serve plain HTTP (loopback only)", fallback=False),
    Setting("gateway.listen", "--gateway-listen", None, "(no gateway)", "text",
            "also serve the agents' gateway (mutual TLS) on HOST:PORT"),
    Setting("gateway.url", "--gateway-url", "BETTER_COMPUTE_GATEWAY_URL",
            "(from gateway.listen)", "text",
            "the gateway URL the well-known document publishes"),
    Setting("gateway.max_handshakes_per_address", None,
            "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES_PER_ADDRESS", "256", "number",
            "TLS handshakes one client address may have under way with the gateway at once "
            "(nodes behind one NAT reconnect together); past it a new connection is closed "
            "before its handshake (0: no bound)"),
    Setting("gateway.max_handshakes", None, "BETTER_COMPUTE_GATEWAY_MAX_HANDSHAKES", "1024",
            "number", "TLS handshakes the gateway has under way at once; past it the oldest "
            "under way is dropped for a new one (0: no bound)"),
    Setting("log.level", "--log-level", None, "warning", "choice",
            "log level; info logs one line per API request",
            ("critical", "error", "warning", "info", "debug"), fallback="warning"),
    Setting("log.format", "--log-format", None, "text", "choice",
            "log lines as text, or one JSON object a line", ("text", "json"),
            fallback="text"),
    Setting("metrics.listen", "--metrics-listen", None, "(none)", "text",
            "also serve GET /metrics without a token on this loopback HOST:PORT"),
    Setting("workers", "--workers", None, "the core count", "number",
            "processes serving the API on one socket; the first also runs the controllers, "
            "the gateway and the loopback /metrics"),
    Setting("store.data_dir", None, "BETTER_COMPUTE_DATA_DIR",
            "$XDG_DATA_HOME/better-compute", "text",
            "the data dir: the SQLite store, the master key, run files"),
    Setting("store.database_url", None, "BETTER_COMPUTE_DATABASE_URL", "(SQLite)", "text",
            "a PostgreSQL URL; every libpq parameter, plus schema=NAME"),
    Setting("master_key.file", None, "BETTER_COMPUTE_MASTER_KEY_FILE",
            "DATA_DIR/master.key", "text", "the master key file that opens the PKI bundle"),
    Setting("master_key.value", None, "BETTER_COMPUTE_MASTER_KEY", "(the file)", "text",
            "the master key itself, instead of the file"),
    Setting("downloads.dir", None, "BETTER_COMPUTE_DOWNLOADS_DIR", "(no downloads)", "text",
            "where GET /api/compute/downloads/bcd_… files are served from"),
    Setting("tokens.ttl", None, "BETTER_COMPUTE_TOKEN_TTL", "90d", "duration",
            "lifetime of a new API token without --ttl"),
    Setting("tokens.max_ttl", None, "BETTER_COMPUTE_TOKEN_MAX_TTL", "365d", "duration",
            "longest lifetime a token may be given"),
    Setting("tokens.rotation_grace", None, "BETTER_COMPUTE_TOKEN_ROTATION_GRACE", "1h",
            "duration", "how long a rotated token's old secret keeps working"),
    Setting("tokens.max_per_tenant", None, "BETTER_COMPUTE_TOKEN_MAX_PER_TENANT", "1000",
            "number", "live API tokens a tenant other than root may hold; past it `tokens "
            "create` is refused (quota_exceeded) (0: no bound)"),
    Setting("tokens.use_flush", None, "BETTER_COMPUTE_TOKEN_USE_FLUSH", "10s", "duration",
            "how often tokens' last use is written"),
    Setting("watch.window", None, "BETTER_COMPUTE_WATCH_WINDOW", "10000", "number",
            "events the /watch hub keeps in memory for its streams"),
    Setting("watch.window_bytes", None, "BETTER_COMPUTE_WATCH_WINDOW_BYTES", "16777216",
            "number", "bytes of events the /watch hub keeps in memory at most (16 MiB)"),
    Setting("watch.poll", None, "BETTER_COMPUTE_WATCH_POLL", "0.005", "duration",
            "how often the /watch hub checks an SQLite store for other processes' commits "
            "while a /watch stream reads (every 50 ms otherwise)"),
    Setting("watch.heartbeat", None, "BETTER_COMPUTE_WATCH_HEARTBEAT", "5s", "duration",
            "a /watch stream's heartbeat when no event comes"),
    Setting("http.head_timeout", None, "BETTER_COMPUTE_HTTP_HEAD_TIMEOUT", "10s", "duration",
            "a TLS handshake not done within this, or a connection (after TLS) or a request "
            "(from its first byte) that has not sent its complete request head within this, "
            "is ended"),
    Setting("http.body_timeout", None, "BETTER_COMPUTE_HTTP_BODY_TIMEOUT", "30s", "duration",
            "a request body not complete within this of its head is refused (HTTP 408) "
            "and its connection closed"),
    Setting("http.send_timeout", None, "BETTER_COMPUTE_HTTP_SEND_TIMEOUT", "30s", "duration",
            "an answer the client takes none of within this (its connection's send buffer "
            "stays full) ends the connection"),
    Setting("http.max_connections_per_address", None,
            "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS_PER_ADDRESS", "256", "number",
            "connections one client address may hold open to a server process at once; past "
            "it a connection is answered HTTP 429 and closed (0: no bound, as behind a proxy "
            "that bounds them)"),
    Setting("http.max_connections", None, "BETTER_COMPUTE_HTTP_MAX_CONNECTIONS", "4096",
            "number", "connections a server process holds open at once; past it a connection "
            "is answered HTTP 503 and closed (0: no bound)"),
    Setting("http.max_handshakes_per_address", None,
            "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES_PER_ADDRESS", "64", "number",
            "TLS handshakes one client address may have under way with a server process at "
            "once; past it a new connection is closed before its handshake (0: no bound)"),
    Setting("http.max_handshakes", None, "BETTER_COMPUTE_HTTP_MAX_HANDSHAKES", "1024",
            "number", "TLS handshakes a server process has under way at once; past it the "
            "oldest under way is dropped for a new one (0: no bound)"),
    Setting("http.trusted_proxies", None, "BETTER_COMPUTE_HTTP_TRUSTED_PROXIES", "(none)",
            "list", "reverse proxies (addresses or networks; * for every peer) whose "
            "X-Forwarded-For names the client; from any other peer the header is ignored "
            "and the client is the connection's address"),
    Setting("shutdown.grace", None, "BETTER_COMPUTE_SHUTDOWN_GRACE", "15s", "duration",
            "after SIGTERM, calls still running this long are cancelled (unanswered) and "
            "the server ends; keep it under the service manager's stop timeout"),
    Setting("shutdown.drain", None, "BETTER_COMPUTE_SHUTDOWN_DRAIN", "(none)", "duration",
            "after SIGTERM, before shutdown.grace, the server serves on this long with /ready "
            "answering 503 and every answer closing its connection, so a load balancer moves "
            "new calls to other replicas first (docs/high-availability.md)"),
    Setting("reservations.max_queued", None, "BETTER_COMPUTE_RESERVATIONS_MAX_QUEUED", "100",
            "number", "queued reservations one tenant may have in one pool; past it `reserve "
            "--queue` is refused (quota_exceeded) when it would queue (0: no bound)"),
    Setting("controllers.tick", None, "BETTER_COMPUTE_CONTROLLER_TICK", "1s", "duration",
            "the controllers' pass at least this often"),
    Setting("controllers.settle", None, "BETTER_COMPUTE_CONTROLLER_SETTLE", "0.2s",
            "duration", "the least time between two controller passes woken by events"),
    Setting("controllers.retry", None, "BETTER_COMPUTE_CONTROLLER_RETRY", "1s", "duration",
            "how often a replica tries to become the controllers' leader"),
    Setting("nodes.heartbeat", None, "BETTER_COMPUTE_NODE_HEARTBEAT", "5s", "duration",
            "the heartbeat interval the gateway asks agents for"),
    Setting("nodes.unreachable_after", None, "BETTER_COMPUTE_NODE_UNREACHABLE_AFTER", "30s",
            "duration", "a node without a session this long is unreachable"),
    Setting("nodes.acceptance_timeout", None, "BETTER_COMPUTE_NODE_ACCEPTANCE_TIMEOUT", "10m",
            "duration", "acceptance checks not reported within this fail"),
)
BY_KEY = {s.key: s for s in SETTINGS if s.key}


@dataclass(frozen=True)
class ServeConfig:
    """The settings as ``serve`` uses them: flag values and the server's environment."""

    values: dict[str, Any]  # by key, for settings with a flag
    env: dict[str, str]


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{key}."))
        else:
            out[key] = value
    return out


def _check(setting: Setting, value: Any, where: str) -> Any:
    kind = setting.kind
    ok = {"bool": isinstance(value, bool),
          "list": isinstance(value, list) and all(isinstance(v, str) for v in value),
          "duration": isinstance(value, str | int | float) and not isinstance(value, bool),
          "number": isinstance(value, int | float) and not isinstance(value, bool),
          }.get(kind, isinstance(value, str))
    if not ok or (setting.choices and value not in setting.choices):
        wanted = {"bool": "true or false", "list": "a list of strings",
                  "duration": _DURATION, "number": "a number"}.get(kind, "a string")
        if setting.choices:
            wanted = " or ".join(repr(c) for c in setting.choices)
        raise InvalidInput(f"{where}: {setting.key} = {value!r} is not {wanted}")
    return value


def load_file(path: Path, named_by: str = "--config") -> dict[str, Any]:
    """The file's settings by key, checked; InvalidInput names the key and the file."""
    try:
        table = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInput(f"{named_by} {path}: no such file") from None
    except OSError as exc:
        raise InvalidInput(f"{named_by} {path}: cannot read it ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{named_by} {path} is not TOML: {exc}") from None
    values = _flatten(table)
    for key, value in values.items():
        setting = BY_KEY.get(key)
        if setting is None:
            close = difflib.get_close_matches(key, list(BY_KEY), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InvalidInput(f"{path}: unknown setting {key!r}{hint}; docs/configuration.md "
                               "lists every setting")
        _check(setting, value, str(path))
    return values


def _as_env(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(value)
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def with_file(env: Mapping[str, str], path: str | None = None) -> dict[str, str]:
    """``env`` with the settings of the config file (``path``, else ``BETTER_COMPUTE_CONFIG``)
    that are environment variables, where the environment does not set them."""
    named_by = "--config" if path else CONFIG_ENV
    path = path or env.get(CONFIG_ENV) or None
    return _merged(env, load_file(Path(path), named_by) if path else {}, path)


def _merged(env: Mapping[str, str], file: Mapping[str, Any], path: str | None
            ) -> dict[str, str]:
    merged = dict(env)
    for setting in SETTINGS:
        if setting.env and not merged.get(setting.env) and setting.key in file:
            merged[setting.env] = _as_env(file[setting.key])
    if path:
        merged[CONFIG_ENV] = path
    return merged


def resolve(flags: Mapping[str, Any], env: Mapping[str, str], path: str | None) -> ServeConfig:
    """Flag > environment > file > default, for every setting."""
    named_by = "--config" if path else CONFIG_ENV
    path = path or env.get(CONFIG_ENV) or None
    file = load_file(Path(path), named_by) if path else {}
    merged = _merged(env, file, path)
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.flag in (None, "--config"):
            continue
        given = flags.get(setting.dest)
        if given is not None and given is not False:
            values[setting.key] = given
        elif setting.env and merged.get(setting.env):
            values[setting.key] = merged[setting.env]
        elif setting.key in file:
            values[setting.key] = file[setting.key]
        else:
            values[setting.key] = setting.fallback
    return ServeConfig(values, merged)
