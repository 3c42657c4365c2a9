"""BETTER_COMPUTE_DATABASE_URL through libpq's own parser: every parameter kept, ours taken out,
the password never shown (api/store/store_url.py)."""

from __future__ import annotations

import pytest

from better_compute.api.store.backup import pg_dump_command
from better_compute.api.store.store import StoreConfig
from better_compute.api.store.store_url import (
    CONNINFO,
    connect_kwargs,
    describe,
    parse_database_url,
    redacted,
    with_schema,
    without_schema,
)
from better_compute.domain.errors import InvalidInput

SECRET = "s3cr3t-pw"


def test_tls_parameters_reach_libpq_and_schema_does_not() -> None:
    pg = parse_database_url(f"postgresql://bc:{SECRET}@db.example.com:6432/compute"
                            "?sslmode=verify-full&sslrootcert=/etc/bc/db-ca.pem&schema=bc_eu1"
                            "&application_name=better-compute")
    assert connect_kwargs(pg) == {
        "user": "bc", "password": SECRET, "host": "db.example.com", "port": "6432",
        "dbname": "compute", "sslmode": "verify-full", "sslrootcert": "/etc/bc/db-ca.pem",
        "application_name": "better-compute"}
    assert pg["POSTGRES_SCHEMA"] == "bc_eu1"
    assert "schema" not in pg[CONNINFO]
    assert describe(pg) == ("PostgreSQL db.example.com:6432/compute schema bc_eu1 "
                            "(sslmode=verify-full)")


@pytest.mark.parametrize("url", [
    "postgresql://bc@/compute?host=/run/postgresql&port=5433",
    "postgresql://bc@%2Frun%2Fpostgresql:5433/compute",
])
def test_unix_socket_urls(url: str) -> None:
    pg = parse_database_url(url)
    assert connect_kwargs(pg)["host"] == "/run/postgresql"
    assert describe(pg) == "PostgreSQL socket /run/postgresql port 5433/compute schema public"


def test_several_hosts_for_a_primary_that_fails_over() -> None:
    pg = parse_database_url("postgresql://bc@pg-a:5432,pg-b:5433/compute"
                            "?target_session_attrs=read-write&schema=s")
    kwargs = connect_kwargs(pg)
    assert (kwargs["host"], kwargs["port"], kwargs["target_session_attrs"]) == (
        "pg-a,pg-b", "5432,5433", "read-write")
    assert describe(pg) == ("PostgreSQL pg-a:5432,pg-b:5433/compute schema s "
                            "(target_session_attrs=read-write)")


def test_the_password_is_in_no_message_and_no_description() -> None:
    url = f"postgresql://bc:{SECRET}@db:5432/compute?sslmode=verify-full"
    config = StoreConfig.from_env({"BETTER_COMPUTE_DATABASE_URL": url,
                                   "BETTER_COMPUTE_DATA_DIR": "/nonexistent"})
    assert SECRET not in config.describe()
    assert SECRET not in repr(describe(config.pg or {}))
    command = pg_dump_command(config, "/tmp/x.dump")
    assert SECRET not in command and "sslmode=verify-full" in command
    for bad in (f"mysql://bc:{SECRET}@db/x", f"postgresql://bc:{SECRET}@db/x?nosuch=1",
                f"postgresql://bc:{SECRET}@db/x?schema=a;drop"):
        with pytest.raises(InvalidInput) as caught:
            parse_database_url(bad)
        assert SECRET not in str(caught.value)
    assert redacted(f"postgresql://bc:{SECRET}@db/x?password={SECRET}") == \
        "postgresql://bc:***@db/x?password=***"


@pytest.mark.parametrize(("url", "needle"), [
    ("http://db/x", "is not a PostgreSQL URL"),
    ("postgresql://bc@db/x?sslmod=require", 'invalid URI query parameter: "sslmod"'),
    ("postgresql://bc@db:5432/x%zz", "not a URL libpq accepts"),
    ("postgresql://bc@db/x?schema=1abc", "is not a schema name"),
    ('postgresql://bc@db/x?schema=a"b', "is not a schema name"),
    ("postgresql://bc@db/x?schema=Compute", "lower-case letters"),
])
def test_bad_urls_name_the_problem(url: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        parse_database_url(url)


@pytest.mark.parametrize("url", [
    "postgresql://bc@db/x",
    "postgresql://bc@/x?host=/run/postgresql",
    "postgresql://bc@db/x?sslmode=verify-full#frag",
])
def test_a_schema_is_added_to_any_url_and_taken_out_again(url: str) -> None:
    added = with_schema(url, "bc_s1")
    assert without_schema(added) == (url, "bc_s1")
    assert parse_database_url(added)["POSTGRES_SCHEMA"] == "bc_s1"
