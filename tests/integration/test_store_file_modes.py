"""The SQLite store's files are private to their owner.

``store.sqlite`` and its ``-wal`` / ``-shm`` files hold every tenant's event
log, the sealed PKI bundle and token hashes. They are 0600 and the data dir
0700, also when the dir already existed with looser modes and whatever the
process's umask (PostgreSQL keeps no files here).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.support import cli_inprocess


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _store_files(data: Path) -> list[Path]:
    return [p for p in data.iterdir() if p.name.startswith("store.sqlite")]


def test_store_files_are_private_in_an_existing_open_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    env = {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", "")}
    old = os.umask(0o022)
    try:
        code, _, err = cli_inprocess(["init"], env)
        assert code == 0, err
        # Another command re-creates the -wal and -shm files (the last close removes them).
        code, _, err = cli_inprocess(["sites", "create", "--kind", "shared", "--region",
                                      "eu-1"], env)
        assert code == 0, err
    finally:
        os.umask(old)
    assert _mode(data) == 0o700
    files = _store_files(data)
    assert any(p.name == "store.sqlite" for p in files)
    loose = {p.name: oct(_mode(p)) for p in files if _mode(p) & 0o077}
    assert not loose, f"store files readable by others: {loose}"


def test_existing_loose_store_files_are_tightened(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = {"BETTER_COMPUTE_DATA_DIR": str(data), "PATH": os.environ.get("PATH", "")}
    assert cli_inprocess(["init"], env)[0] == 0
    os.chmod(data, 0o755)
    for path in _store_files(data):
        os.chmod(path, 0o644)
    assert cli_inprocess(["api", "system.whoami"], env)[0] == 0
    assert _mode(data) == 0o700
    assert all(_mode(p) == 0o600 for p in _store_files(data)), [
        (p.name, oct(_mode(p))) for p in _store_files(data)]
