"""``BETTER_COMPUTE_DATABASE_URL`` as libpq reads it: every parameter, our schema, no password shown.

The URL goes to psycopg's own conninfo parser (libpq's), so every libpq parameter
works as PostgreSQL documents it: ``sslmode=verify-full`` with ``sslrootcert``,
``sslcert``/``sslkey``, a unix socket (``postgresql://bc@/bc?host=/run/postgresql`` or
``postgresql://bc@%2Frun%2Fpostgresql/bc``), several hosts with
``target_session_attrs=read-write`` (the client connects to whichever is the primary),
``connect_timeout``, ``application_name``, ``passfile``; and the ``PG*`` environment
variables and ``~/.pgpass`` for what the URL leaves out. The one parameter that is ours,
``schema``, is taken out before libpq sees it: it puts every table of the control plane
in that schema.

The settings are a mapping of the library's ``POSTGRES_*`` names (how the store, the
leader election and backups read them) plus :data:`CONNINFO`, the URL without
``schema``, which the store's connection pool (api/store/pg_factory.py), the set-up lock and
the leader's connection hand to psycopg whole. Messages and :func:`describe` never show
the password.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from better_compute.domain.errors import InvalidInput

CONNINFO = "POSTGRES_CONNINFO"
URL_FORM = "postgresql://USER:PASSWORD@HOST:PORT/DBNAME[?sslmode=verify-full&schema=NAME]"
_SCHEMES = ("postgresql://", "postgres://")
# Lower case only: the event store's PostgreSQL types are looked up by the name unquoted,
# which PostgreSQL folds to lower case, so a schema with a capital could never save.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}\Z")
_USERINFO_RE = re.compile(r"(://[^:@/?#]*):[^@/?#]*@")


def redacted(url: str) -> str:
    """``url`` with the password in its user part replaced by ``***``; ``password=`` too."""
    shown = _USERINFO_RE.sub(r"\1:***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", shown)


def with_schema(url: str, schema: str) -> str:
    """``url`` with our ``schema`` parameter added to its query (which it may already have)."""
    base, hash_sep, fragment = url.partition("#")
    return f"{base}{'&' if '?' in base else '?'}schema={schema}{hash_sep}{fragment}"


def without_schema(url: str) -> tuple[str, str | None]:
    """The URL with our ``schema`` parameter taken out of its query, and that schema."""
    base, sep, rest = url.partition("?")
    if not sep:
        return url, None
    query, hash_sep, fragment = rest.partition("#")
    kept, schema = [], None
    for item in query.split("&"):
        name, _, value = item.partition("=")
        if name == "schema":
            schema = value
        elif item:
            kept.append(item)
    tail = ("?" + "&".join(kept) if kept else "") + (hash_sep + fragment)
    return base + tail, schema


def parse_database_url(url: str) -> dict[str, str]:
    """The store's PostgreSQL settings from the URL, or InvalidInput naming the problem."""
    url = url.strip()
    shown = redacted(url)
    if not url.startswith(_SCHEMES):
        raise InvalidInput(
            f"BETTER_COMPUTE_DATABASE_URL {shown!r} is not a PostgreSQL URL: write {URL_FORM} "
            "(docs/configuration.md), or unset it to use SQLite")
    libpq_url, schema = without_schema(url)
    if schema is not None and not _SCHEMA_RE.match(schema):
        raise InvalidInput(
            f"BETTER_COMPUTE_DATABASE_URL's schema {schema[:70]!r} is not a schema name: use "
            "lower-case letters, digits and _ (at most 63, not starting with a digit), "
            "e.g. schema=compute")
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(libpq_url)
    except ProgrammingError as exc:
        raise InvalidInput(
            f"BETTER_COMPUTE_DATABASE_URL {shown!r} is not a URL libpq accepts: "
            f"{redacted(str(exc))}. Write {URL_FORM}; every libpq parameter is allowed") from None
    ports = str(params.get("port") or "5432")
    if not all(p.strip().isdigit() and 0 < int(p) < 65536 for p in ports.split(",")):
        raise InvalidInput(
            f"BETTER_COMPUTE_DATABASE_URL {shown!r} has a port that is not a number from 1 to "
            f"65535: write {URL_FORM}")
    settings = {
        "POSTGRES_HOST": str(params.get("host") or ""),
        "POSTGRES_PORT": str(params.get("port") or "5432"),
        "POSTGRES_USER": str(params.get("user") or ""),
        "POSTGRES_PASSWORD": str(params.get("password") or ""),
        "POSTGRES_DBNAME": str(params.get("dbname") or params.get("user") or ""),
        CONNINFO: libpq_url,
    }
    if schema:
        settings["POSTGRES_SCHEMA"] = schema
    return settings


def connect_kwargs(pg: Mapping[str, str]) -> dict[str, Any]:
    """What ``psycopg.connect(**…)`` takes for these settings: every libpq parameter."""
    from psycopg.conninfo import conninfo_to_dict

    return dict(conninfo_to_dict(pg[CONNINFO]))


def session_connection(pg: Mapping[str, str], connect_timeout: int) -> Any:
    """A connection of its own, in autocommit, for session advisory locks that live as long
    as it does (the controllers' leadership, named locks); the URL's own connect_timeout wins."""
    import psycopg

    return psycopg.connect(**{"connect_timeout": connect_timeout, **connect_kwargs(pg)},
                           autocommit=True)


def conninfo_without_password(pg: Mapping[str, str]) -> str:
    """A libpq connection string for other tools (pg_dump), the password left out."""
    from psycopg.conninfo import make_conninfo

    kwargs = {k: v for k, v in connect_kwargs(pg).items() if k != "password"}
    return make_conninfo("", **kwargs)


def describe(pg: Mapping[str, str]) -> str:
    """``PostgreSQL HOST:PORT/DBNAME schema S`` (hosts in order, a socket by its folder)."""
    kwargs = connect_kwargs(pg)
    hosts = str(kwargs.get("host") or "").split(",")
    ports = str(kwargs.get("port") or "5432").split(",")
    where = []
    for n, host in enumerate(hosts):
        port = ports[n] if n < len(ports) else ports[-1]
        where.append("the default socket" if not host
                     else f"socket {host} port {port}" if host.startswith("/")
                     else f"{f'[{host}]' if ':' in host else host}:{port}")
    extras = [f"{k}={kwargs[k]}" for k in ("sslmode", "target_session_attrs") if k in kwargs]
    return (f"PostgreSQL {','.join(where)}/{kwargs.get('dbname') or pg.get('POSTGRES_DBNAME')} "
            f"schema {pg.get('POSTGRES_SCHEMA') or 'public'}"
            + (f" ({', '.join(extras)})" if extras else ""))
