"""The store's datastores are the factories' subclasses, set up as open_store leaves them
(api/store/sqlite_factory.py, api/store/pg_factory.py): connections guarded; SQLite's writers
holding the writer lock; PostgreSQL's pool connecting with the URL's every parameter, the
schema's search_path, libpq's timeouts unless the URL names its own, and a short reconnect."""

from __future__ import annotations

from better_compute.api.store.pg_factory import (
    CONNECT_TIMEOUT,
    POOL_RECONNECT_TIMEOUT,
    TCP_USER_TIMEOUT_MS,
    StorePostgresDatastore,
)
from better_compute.api.store.sqlite_factory import StoreSQLiteDatastore
from better_compute.api.store.store import StoreConfig, open_store, setup_lock


def test_the_store_s_datastore_is_set_up_by_its_factory_and_open_store(env: dict[str, str]
                                                                       ) -> None:
    url = env.get("BETTER_COMPUTE_DATABASE_URL")
    if url:  # the URL's own connect_timeout wins over the store's
        env["BETTER_COMPUTE_DATABASE_URL"] = f"{url}&connect_timeout=7&application_name=bc-t"
    config = StoreConfig.from_env(env)
    with setup_lock(config):
        store = open_store(config)
    try:
        datastore = store.recorder.datastore  # type: ignore[attr-defined]
        assert datastore.guard is store.guard  # every connection goes through it
        if config.backend == "sqlite":
            assert isinstance(datastore, StoreSQLiteDatastore)
            assert datastore.writers is not None
            assert datastore.writers.path.name == "store.sqlite-writer.lock"
            return
        assert isinstance(datastore, StorePostgresDatastore)
        pool = datastore.pool
        kwargs = pool.kwargs
        assert isinstance(kwargs, dict)
        assert kwargs["connect_timeout"] == "7" != str(CONNECT_TIMEOUT)
        assert kwargs["application_name"] == "bc-t"  # a parameter the library knows nothing of
        assert kwargs["tcp_user_timeout"] == TCP_USER_TIMEOUT_MS
        assert kwargs["options"] == f"-c search_path={datastore.schema}"
        assert datastore.schema == config.pg["POSTGRES_SCHEMA"]  # type: ignore[index]
        assert pool.reconnect_timeout == POOL_RECONNECT_TIMEOUT
        assert (pool.min_size, pool.max_size, pool.timeout) == (5, 15, 5)  # the store's settings
        with store.sql().transaction(commit=False) as cursor:  # connects with them
            cursor.execute("SHOW application_name")
            assert cursor.fetchone()["application_name"] == "bc-t"
    finally:
        store.close()
