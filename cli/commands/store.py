"""store backup, store restore, store verify: the local store's files, not the API.

These work on the store this machine opens (BETTER_COMPUTE_DATA_DIR, or
BETTER_COMPUTE_DATABASE_URL), like `init` and `serve`: run them on the
server's machine. docs/operations.md describes backups and restores.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from better_compute.cli.context import Context
from better_compute.cli.registry import add_group, add_verb

BACKUP_EXAMPLES = [
    'better-compute store backup --out /backups/store-$(date +%F).sqlite   # while serve runs',
    'BETTER_COMPUTE_DATA_DIR=/srv/bc better-compute store backup --out /backups/bc.sqlite',
]

RESTORE_EXAMPLES = [
    'BETTER_COMPUTE_DATA_DIR=/srv/bc-new better-compute store restore /backups/bc.sqlite',
    'cp /safe/master.key /srv/bc-new/master.key     # the backup does not hold the master key',
    'BETTER_COMPUTE_DATA_DIR=/srv/bc-new better-compute store verify',
]

VERIFY_EXAMPLES = [
    'better-compute store verify                 # a progress bar on a terminal; exit 1 on problems',
    'better-compute store verify --query problems',
]


def _config(ctx: Context) -> Any:
    from better_compute.api.store.store import StoreConfig

    if ctx.env.get("BETTER_COMPUTE_URL", "").strip():
        print("note: store commands work on this machine's store, not on BETTER_COMPUTE_URL",
              file=sys.stderr)
    return StoreConfig.from_env(ctx.env)


def _require_initialized(ctx: Context) -> None:
    """A store `init` never ran on has nothing to back up or verify: not_initialized."""
    from better_compute.api.runtime import Runtime

    runtime = Runtime.open(ctx.env)
    try:
        runtime.service.pki()
    finally:
        runtime.close()


def store_backup(ctx: Context, a: argparse.Namespace) -> None:
    from better_compute.api.store.backup import backup_sqlite

    config = _config(ctx)
    _require_initialized(ctx)
    ctx.emit(backup_sqlite(config, Path(a.out)))


def store_restore(ctx: Context, a: argparse.Namespace) -> None:
    from better_compute.api.store.backup import restore_sqlite

    config = _config(ctx)
    done = restore_sqlite(config, Path(a.backup))
    key = ctx.env.get("BETTER_COMPUTE_MASTER_KEY_FILE") or str(config.data_dir / "master.key")
    if not ctx.env.get("BETTER_COMPUTE_MASTER_KEY") and not Path(key).exists():
        done["next"] = (f"put the master key at {key} (a backup never holds it), then run "
                        "`better-compute store verify`")
    ctx.emit(done)


@contextmanager
def _progress(show: bool) -> Iterator[Any]:
    """A rich progress bar on standard error when it is a terminal; else nothing."""
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        tasks: dict[str, Any] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=max(total, 1))
            bar.update(tasks[phase], completed=done, total=max(total, 1))

        yield update


def store_verify(ctx: Context, a: argparse.Namespace) -> int:
    from better_compute.api.runtime import Runtime
    from better_compute.api.store.verify import verify

    _config(ctx)
    runtime = Runtime.open(ctx.env)
    try:
        runtime.service.pki()  # a store `init` never ran on: not_initialized
        with _progress(sys.stderr.isatty()) as update:
            report = verify(runtime, update)
    finally:
        runtime.close()
    ctx.emit(report)
    return 0 if report["ok"] else 1


def register(sub: Any) -> None:
    g = add_group(sub, "store", "The local store's files: backup, restore, verify.",
                  examples=[*BACKUP_EXAMPLES[:1], *VERIFY_EXAMPLES[:1]])
    p = add_verb(g, "backup", store_backup,
                 "Copy the store to FILE while the server runs (SQLite's online backup: one "
                 "consistent snapshot); on PostgreSQL, says the pg_dump command to use.",
                 examples=BACKUP_EXAMPLES)
    p.add_argument("--out", required=True, metavar="FILE",
                   help="the backup file to write (mode 0600, never overwritten)")
    p = add_verb(g, "restore", store_restore,
                 "Put a backup into a fresh data dir (refused over an existing store).",
                 examples=RESTORE_EXAMPLES)
    p.add_argument("backup", metavar="FILE", help="a file `store backup` wrote")
    add_verb(g, "verify", store_verify,
             "Read every event: sequences, decoding, each aggregate's replay, and each read "
             "model against a rebuild in a scratch copy; exit 1 on any problem.",
             examples=VERIFY_EXAMPLES)
