"""Where bcd join reads its token from, and what it refuses."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from better_compute.agent.errors import BcdError
from better_compute.agent.join_token import read_token, read_token_file

SECRET = "bcjt_0123456789abcdef"


def _file(tmp_path: Path, mode: int, text: str = SECRET + "\n") -> Path:
    path = tmp_path / "join-token"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_owner_only_files_are_read(tmp_path: Path, mode: int) -> None:
    token = read_token_file(_file(tmp_path, mode))
    assert token.secret == SECRET and token.file == tmp_path / "join-token"
    assert SECRET not in repr(token)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o700, 0o660])
def test_loose_modes_are_refused_with_the_chmod(tmp_path: Path, mode: int) -> None:
    path = _file(tmp_path, mode)
    with pytest.raises(BcdError, match=f"mode {mode:04o}.*chmod 600"):
        read_token_file(path)
    assert path.exists()


def test_a_symlink_is_refused_even_to_a_good_file(tmp_path: Path) -> None:
    target = _file(tmp_path, 0o600)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(BcdError, match="symbolic link"):
        read_token_file(link)
    assert target.exists()


def test_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir(mode=0o700)
    with pytest.raises(BcdError, match="not a regular file"):
        read_token_file(folder)
    with pytest.raises(BcdError, match="does not exist"):
        read_token_file(tmp_path / "nope")


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_a_file_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, 0o600)
    os.chown(path, 65534, 65534)
    with pytest.raises(BcdError, match="belongs to uid 65534"):
        read_token_file(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_empty_token_files_are_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(BcdError, match="no join token"):
        read_token_file(_file(tmp_path, 0o600, text))


def test_two_words_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BcdError, match="one line without spaces"):
        read_token_file(_file(tmp_path, 0o600, "one\ntwo\n"))


def test_sources_in_order_file_then_environment_then_stdin(tmp_path: Path) -> None:
    path = _file(tmp_path, 0o600)
    env = {"BCD_JOIN_TOKEN": "from-env"}
    assert read_token(str(path), env, io.StringIO("from-stdin")).secret == SECRET
    assert read_token(None, env, io.StringIO("from-stdin")).secret == "from-env"
    assert read_token(None, {}, io.StringIO("from-stdin\n")).secret == "from-stdin"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_is_never_read_and_the_fix_is_given() -> None:
    with pytest.raises(BcdError, match="never a command-line argument"):
        read_token(None, {}, _Terminal("typed"))
    with pytest.raises(BcdError, match="BCD_JOIN_TOKEN"):
        read_token(None, {}, None)
