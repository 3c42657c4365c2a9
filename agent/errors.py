"""The error bcd's commands raise for anything the operator must fix.

bcd cannot import the control plane's error tree (domain/ stays off the nodes),
so it has its own: :class:`BcdError` carries a message that names the problem
and the fix, and main() prints it as one line and exits with the status of its
``code``: the control plane's stable error code when the error came from it, else the
code of what went wrong here (``invalid_input`` for a flag, pin or token file,
``unavailable`` when the control plane cannot be reached, ``not_initialized`` before
the machine joined, …), graded as the CLI grades them (api/wire/exit_statuses.py,
docs/bcd.md). Anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import errno

from better_compute.api.wire.exit_statuses import for_code


class BcdError(Exception):
    """A refusal or failure the operator can act on; ``exit_code`` is bcd's exit status."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # the stable error code: the control plane's, or bcd's own

    @property
    def exit_code(self) -> int:
        return for_code(self.code)

    def __str__(self) -> str:
        return self.message


class UsageError(BcdError):
    """Wrong flags, arguments or input files such as a token file (``invalid_input``, exit
    status 2, like argparse's own usage errors)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_input")


def io_code(exc: OSError) -> str | None:
    """``permission_denied`` for a file bcd may not read (not root), else no class."""
    return "permission_denied" if exc.errno in (errno.EACCES, errno.EPERM) else None
