"""Backups of the store: SQLite's online backup API, or the pg_dump command for PostgreSQL.

``backup_sqlite`` copies the whole database in ONE step of SQLite's backup
API, inside one read transaction: a consistent snapshot (every event up to
some sequence, the read models and their tracking positions as of that
moment), taken while the server keeps writing (WAL mode: writers never wait
for it). The copy is written beside the target, checked (``PRAGMA
integrity_check``), made a self-contained file (journal mode DELETE, mode
0600: it holds the sealed PKI bundle and token hashes) and only then linked
into place, never over an existing file.

``restore_sqlite`` puts a backup into a fresh data dir the same way. The
master key is NOT in a backup (``init`` says to keep it apart): restore it
beside the store, or point BETTER_COMPUTE_MASTER_KEY_FILE at it.

A PostgreSQL store is backed up with PostgreSQL's own tools; ``pg_dump_command``
says exactly how for this store's URL and schema, never printing the password.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
from pathlib import Path
from typing import Any

from better_compute.api.store.store import StoreConfig
from better_compute.api.store.store_url import conninfo_without_password
from better_compute.domain.errors import Conflict, InvalidInput, NotFound


def _conninfo(config: StoreConfig) -> str:
    assert config.pg is not None
    return conninfo_without_password(config.pg)


def pg_dump_command(config: StoreConfig, out: str) -> str:
    """The pg_dump command line that backs up this store (its schema only), no password."""
    schema = (config.pg or {}).get("POSTGRES_SCHEMA") or "public"
    return (f"pg_dump --format=custom --schema={shlex.quote(schema)} "
            f"--file={shlex.quote(out)} {shlex.quote(_conninfo(config))}")


def pg_restore_command(config: StoreConfig, backup: str) -> str:
    return (f"pg_restore --no-owner --exit-on-error --dbname={shlex.quote(_conninfo(config))} "
            f"{shlex.quote(backup)}")


def not_on_postgres(config: StoreConfig, out: str, what: str) -> InvalidInput:
    return InvalidInput(
        f"store {what} works on SQLite stores; this store is {config.describe()}. Back it up "
        f"with PostgreSQL's pg_dump (consistent while the server writes): "
        f"`{pg_dump_command(config, out)}` and restore it into an empty database with "
        f"`{pg_restore_command(config, out)}`. The password is not shown: give it through "
        "PGPASSWORD or ~/.pgpass")


def _check_new(path: Path, what: str) -> None:
    if path.exists():
        raise Conflict(f"{path} exists: {what} never overwrites a file; give a new path")
    if not path.parent.is_dir():
        raise InvalidInput(f"{path.parent} is not a directory: create it first")


def _copy(source: Path, target: Path) -> dict[str, Any]:
    """``source`` copied to ``target`` in one backup step, checked, 0600, never over a file."""
    partial = target.with_name(f".{target.name}.partial-{os.getpid()}")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(str(source), timeout=30)
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        dst = sqlite3.connect(str(partial))
        try:
            src.backup(dst)  # pages=-1: everything in one step, one read transaction
            dst.execute("PRAGMA journal_mode=DELETE")
            check = dst.execute("PRAGMA integrity_check").fetchone()[0]
            if check != "ok":
                raise InvalidInput(f"the copy of {source} failed its integrity check: {check}")
            head, events = dst.execute(
                "SELECT COALESCE(MAX(rowid), 0), COUNT(*) FROM stored_events").fetchone()
        finally:
            dst.close()
        os.link(partial, target)  # fails rather than replace a file that appeared meanwhile
    except sqlite3.DatabaseError as exc:
        raise InvalidInput(f"cannot copy {source}: {exc}") from None
    finally:
        src.close()
        partial.unlink(missing_ok=True)
    return {"file": str(target), "bytes": target.stat().st_size, "head": int(head),
            "events": int(events)}


def backup_sqlite(config: StoreConfig, out: Path) -> dict[str, Any]:
    if config.backend != "sqlite":
        raise not_on_postgres(config, str(out), "backup")
    assert config.sqlite_path is not None
    if not config.sqlite_path.exists():
        raise NotFound(f"no store at {config.sqlite_path}: check BETTER_COMPUTE_DATA_DIR "
                       "(`better-compute init` creates one)")
    _check_new(out, "store backup")
    return {**_copy(config.sqlite_path, out), "store": config.describe()}


def restore_sqlite(config: StoreConfig, backup: Path) -> dict[str, Any]:
    if config.backend != "sqlite":
        raise not_on_postgres(config, str(backup), "restore")
    assert config.sqlite_path is not None
    if not backup.is_file():
        raise NotFound(f"no backup file {backup}")
    try:
        probe = sqlite3.connect(f"file:{backup}?mode=ro", uri=True)
        try:
            probe.execute("SELECT 1 FROM stored_events LIMIT 1").fetchall()
        finally:
            probe.close()
    except sqlite3.DatabaseError:
        raise InvalidInput(f"{backup} is not a better-compute store backup (no event table): "
                           "give a file `better-compute store backup` wrote") from None
    target = config.sqlite_path
    if target.exists() or Path(f"{target}-wal").exists():
        raise Conflict(f"{target} exists: restore into a fresh data dir (set "
                       "BETTER_COMPUTE_DATA_DIR to an empty folder), never over a store")
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    copied = _copy(backup, target)
    return {**copied, "file": str(target), "from": str(backup), "store": config.describe()}
