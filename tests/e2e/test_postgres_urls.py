"""The store on PostgreSQL as production runs it: TLS verify-full, a unix socket, a failover.

Each URL is what an operator writes into BETTER_COMPUTE_DATABASE_URL; libpq reads all of
it (api/store/store_url.py). The clusters are real (tests/pg_clusters.py): one serving TLS
with a certificate this test makes and refusing TCP without TLS, and a primary with a
streaming standby that is promoted when the primary stops (docs/configuration.md says
why a real standby rather than two unrelated clusters).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from better_compute.api.runtime import Runtime
from better_compute.api.store.outage import NO_PRIMARY
from better_compute.domain.access import Principal
from better_compute.domain.errors import Unavailable
from tests.cluster import Operator
from tests.pg_clusters import Cluster, Tls, cluster, enable_tls, standby_of
from tests.support import (
    cli_inprocess,
    client_env,
    eventually,
    initialize,
    open_runtime,
    quick_init,
    serve,
)

PASSWORD = "pw-never-shown"  # trust authentication ignores it; nothing may print it


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[Cluster, Tls]]:
    with cluster() as server:
        yield server, enable_tls(server)


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    data = tmp_path / "data"
    data.mkdir(parents=True, exist_ok=True)
    return {"BETTER_COMPUTE_DATA_DIR": str(data), "BETTER_COMPUTE_DATABASE_URL": url,
            "PATH": "/usr/bin:/bin"}


def _tcp_sessions(server: Cluster) -> tuple[int, int]:
    """Client sessions over TCP: (with TLS, without)."""
    with server.admin() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) "
            "FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.client_addr IS NOT NULL AND a.backend_type = 'client backend'").fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


def _advisory_locks(server: Cluster) -> int:
    with server.admin() as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'").fetchone()
    return int(str(row[0])) if row else 0


def test_serve_on_postgresql_with_verify_full(tls_server: tuple[Cluster, Tls],
                                              tmp_path: Path) -> None:
    server, tls = tls_server
    url = (f"postgresql://bc:{PASSWORD}@127.0.0.1:{server.port}/postgres?sslmode=verify-full"
           f"&sslrootcert={tls.ca_file}&schema=bc_tls&application_name=bc-tls-test")
    env = _env(tmp_path, url)
    token = initialize(env)
    with serve(env, log_file=tmp_path / "serve.log") as running:
        operator = Operator(client_env(env, running, token))
        operator.cli("tenants", "create", "acme")
        assert "acme" in operator.cli("tenants", "list")
        # The pool and the controllers' leader connection are up, every one of them over TLS
        # (pg_hba refuses TCP without it): the leader holds its advisory lock.
        eventually(lambda: _advisory_locks(server) >= 1, "the controllers' leader locks")
        with_tls, without = _tcp_sessions(server)
        assert with_tls >= 2 and without == 0
    assert PASSWORD not in (tmp_path / "serve.log").read_text()


def test_verify_full_refuses_a_server_the_pinned_ca_did_not_sign(
        tls_server: tuple[Cluster, Tls], tmp_path: Path) -> None:
    server, tls = tls_server
    wrong = _env(tmp_path, f"postgresql://bc:{PASSWORD}@127.0.0.1:{server.port}/postgres"
                           f"?sslmode=verify-full&sslrootcert={tls.other_ca_file}&schema=bc_x")
    with pytest.raises(Unavailable) as refused:
        Runtime.open(wrong)
    assert "certificate verify failed" in str(refused.value)
    assert PASSWORD not in str(refused.value)
    plain = _env(tmp_path, server.url(sslmode="disable", schema="bc_x"))
    with pytest.raises(Unavailable, match="no encryption"):
        Runtime.open(plain)


def test_a_unix_socket_url(tls_server: tuple[Cluster, Tls], tmp_path: Path) -> None:
    server, _ = tls_server
    for url in (f"postgresql://bc@/postgres?host={server.folder}&port={server.port}&schema=bc_s1",
                f"postgresql://bc@{str(server.folder).replace('/', '%2F')}:{server.port}"
                "/postgres?schema=bc_s2"):
        runtime = open_runtime(_env(tmp_path / url[-5:], url))
        try:
            quick_init(runtime)
            assert runtime.config.describe().startswith(f"PostgreSQL socket {server.folder} ")
            sql = runtime.projections.sql
            with sql.transaction(commit=False) as cursor:
                cursor.execute("SELECT inet_server_addr() AS addr")
                assert cursor.fetchone()["addr"] is None  # not TCP: the socket
            assert [t["id"] for t in runtime.service.tenants_list(_root(runtime))] == ["root"]
        finally:
            runtime.close()


def _root(runtime: Runtime) -> Principal:
    from better_compute.domain.access import LOCAL_OPERATOR

    return LOCAL_OPERATOR


def test_the_server_follows_the_primary_to_a_promoted_standby(tmp_path: Path) -> None:
    with cluster() as first, standby_of(first) as second:
        url = (f"postgresql://bc@127.0.0.1:{first.port},127.0.0.1:{second.port}/postgres"
               "?target_session_attrs=read-write&connect_timeout=5&schema=bc_failover")
        env = _env(tmp_path, url)
        token = initialize(env)
        with serve(env, log_file=tmp_path / "serve.log") as running:
            operator = Operator(client_env(env, running, token))
            before = operator.cli("sites", "create", "--kind", "shared", "--region", "eu-1",
                                  "--key", "before", "--query", "id")
            eventually(lambda: _advisory_locks(first) >= 1, "the leader locks on the primary")
            assert _tcp_sessions(second) == (0, 0)  # a standby: read-write skips it

            first.stop()
            # Until the standby is promoted, no server takes writes: a write answers
            # `unavailable` and says so, at once (the store's probe uses every parameter of
            # the URL: it once connected to the standby, found the store "up", and each
            # call then waited for a pooled connection that could never open).
            def refused_for_want_of_a_primary() -> bool:
                code, _, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region",
                                              "eu-1", "--key", "during"], operator.env)
                assert code != 0, "a write succeeded with no primary"
                return "[unavailable]" in err and NO_PRIMARY in err

            eventually(refused_for_want_of_a_primary, "a write names the missing primary",
                       timeout=60)
            second.promote()

            def writes() -> bool:
                code, _, _ = cli_inprocess(["sites", "create", "--kind", "shared", "--region",
                                            "eu-1", "--key", "after"], operator.env)
                return code == 0

            eventually(writes, "a write succeeds on the promoted standby", timeout=90)
            sites = operator.cli_json("sites", "list")
            assert before in [s["id"] for s in sites] and len(sites) == 2
            eventually(lambda: _advisory_locks(second) >= 1, "the leader locks on the new "
                       "primary", timeout=60)
