"""Where `bcd join` reads the join token from, and the checks on a token file.

The token is never a command-line argument (arguments show in `ps` and in shell
history). bcd reads it from, in this order: ``--token-file FILE``, the
BCD_JOIN_TOKEN variable, or standard input when that is not a terminal. A token
file must be a regular file (not a symlink: it is opened with O_NOFOLLOW and
checked again after opening), owned by the user running bcd, with mode 0600 or
0400; it is deleted once the join succeeded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .errors import BcdError, UsageError, io_code

TOKEN_ENV = "BCD_JOIN_TOKEN"
ALLOWED_MODES = (0o600, 0o400)
_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class JoinToken:
    secret: str
    file: Path | None = None  # the --token-file to delete after a successful join
    source: str = "standard input"

    def __repr__(self) -> str:  # never print the secret, not even in a traceback
        return f"JoinToken(source={self.source!r}, file={self.file!r})"


def parse_token(text: str, source: str) -> str:
    """The one token in ``text``: blank lines and ``#`` comments are skipped."""
    lines = [line.strip() for line in text.splitlines()]
    values = [line for line in lines if line and not line.startswith("#")]
    if not values:
        raise UsageError(
            f"no join token in {source}: mint one with `better-compute join-tokens create "
            "--pool POOL --out ./join-token` and give bcd that file"
        )
    if len(values) > 1 or any(ch.isspace() for ch in values[0]):
        raise UsageError(
            f"{source} holds more than one word; a join token is one line without spaces, "
            "as `better-compute join-tokens create --out FILE` writes it"
        )
    return values[0]


def read_token_file(path: str | os.PathLike[str]) -> JoinToken:
    file = Path(path)
    try:
        before = os.lstat(file)
    except FileNotFoundError:
        raise UsageError(f"--token-file {file} does not exist") from None
    except OSError as exc:
        raise BcdError(f"cannot read --token-file {file}: {exc.strerror}",
                       code=io_code(exc) or "invalid_input") from None
    if stat.S_ISLNK(before.st_mode):
        raise UsageError(
            f"--token-file {file} is a symbolic link; bcd reads only a regular file: "
            "give the path of the file itself"
        )
    if not stat.S_ISREG(before.st_mode):
        raise UsageError(f"--token-file {file} is not a regular file")
    mode = stat.S_IMODE(before.st_mode)
    if mode not in ALLOWED_MODES:
        raise UsageError(
            f"--token-file {file} has mode {mode:04o}; a join token file must be readable by its "
            f"owner alone: run `chmod 600 {file}` (0600 or 0400 are accepted)"
        )
    if before.st_uid != os.geteuid():
        raise UsageError(
            f"--token-file {file} belongs to uid {before.st_uid}, not to the user running bcd "
            f"(uid {os.geteuid()}): `chown` it to that user, or run bcd as its owner"
        )
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise BcdError(f"cannot open --token-file {file}: {exc.strerror}",
                       code=io_code(exc) or "invalid_input") from None
    with os.fdopen(fd, "rb") as handle:
        after = os.fstat(handle.fileno())
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise UsageError(f"--token-file {file} was replaced while bcd read it; run bcd again")
        data = handle.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        raise UsageError(f"--token-file {file} is larger than a join token can be")
    source = f"--token-file {file}"
    return JoinToken(parse_token(data.decode("utf-8", "replace"), source), file, source)


def read_token(token_file: str | None, env: Mapping[str, str], stdin: TextIO | None) -> JoinToken:
    """The join token from --token-file, BCD_JOIN_TOKEN or standard input, in that order."""
    if token_file:
        return read_token_file(token_file)
    value = env.get(TOKEN_ENV)
    if value:
        return JoinToken(parse_token(value, TOKEN_ENV), None, TOKEN_ENV)
    if stdin is not None and not stdin.isatty():
        text = stdin.read(_MAX_BYTES + 1)
        if len(text) > _MAX_BYTES:
            raise UsageError("standard input is larger than a join token can be")
        return JoinToken(parse_token(text, "standard input"), None, "standard input")
    raise UsageError(
        "no join token: pipe it in (`bcd join ... < join-token`), set BCD_JOIN_TOKEN, or pass "
        "--token-file FILE (mode 0600); it is never a command-line argument"
    )
