"""The error bcd's commands raise for anything the operator must fix.

bcd cannot import the control plane's error tree (domain/ stays off the nodes),
so it has its own: :class:`BcdError` carries a message that names the problem
and the fix, and main() prints it as one line and exits non-zero. Anything else
is a bug and shows its traceback.
"""

from __future__ import annotations


class BcdError(Exception):
    """A refusal or failure the operator can act on; ``exit_code`` is bcd's exit status."""

    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code  # the control plane's stable error code, when it sent one

    def __str__(self) -> str:
        return self.message


class UsageError(BcdError):
    """Wrong flags or arguments (exit status 2, like argparse's own usage errors)."""

    exit_code = 2
