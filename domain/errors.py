"""The project's one error tree.

Every error that crosses a boundary (JSON-RPC, the CLI, bcd) is one of these.
Each class has a stable string ``code`` that travels on the wire; the client
rebuilds the same class from it. ``rpc_code`` is the JSON-RPC 2.0 number.

    BetterComputeError
    ├── InvalidInput          bad parameters, files or flags   (invalid_input)
    │   ├── PolicyError       a pool policy file is invalid    (invalid_policy)
    │   ├── KubernetesNotEnabled  --kubernetes on a pool without policy.kubernetes
    │   │                                                      (kubernetes_not_enabled)
    │   └── Ambiguous         a name that names several objects (ambiguous)
    ├── Unauthenticated       no or unknown token              (unauthenticated)
    ├── PermissionDenied      the caller's role or tenant      (permission_denied)
    ├── NotFound              no such object for this caller   (not_found)
    ├── Conflict              already exists / key reused      (conflict)
    ├── QuotaExceeded         an offering's quota              (quota_exceeded)
    ├── NoCapacity            nothing fits now                 (no_capacity)
    ├── Expired               a log position or token expired  (expired)
    ├── NotInitialized        the store has no PKI/root yet    (not_initialized)
    ├── Unavailable           a dependency is down             (unavailable)
    ├── RateLimited           too many calls of one token      (rate_limited)
    └── FellBehind            a stream's reader fell behind    (fell_behind)
"""

from __future__ import annotations

from typing import Any, ClassVar


class BetterComputeError(Exception):
    code: ClassVar[str] = "error"
    rpc_code: ClassVar[int] = -32000

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}

    def __str__(self) -> str:
        return self.message


class InvalidInput(BetterComputeError):
    code = "invalid_input"
    rpc_code = -32602


class PolicyError(InvalidInput):
    code = "invalid_policy"


class KubernetesNotEnabled(InvalidInput):
    code = "kubernetes_not_enabled"


class Ambiguous(InvalidInput):
    """A name given where an id is taken names several objects; ``data.matches`` lists them."""

    code = "ambiguous"


class Unauthenticated(BetterComputeError):
    code = "unauthenticated"
    rpc_code = -32001


class PermissionDenied(BetterComputeError):
    code = "permission_denied"
    rpc_code = -32003


class NotFound(BetterComputeError):
    code = "not_found"
    rpc_code = -32004


class Conflict(BetterComputeError):
    code = "conflict"
    rpc_code = -32009


class QuotaExceeded(BetterComputeError):
    code = "quota_exceeded"
    rpc_code = -32010


class NoCapacity(BetterComputeError):
    code = "no_capacity"
    rpc_code = -32011


class Expired(BetterComputeError):
    code = "expired"
    rpc_code = -32012


class NotInitialized(BetterComputeError):
    code = "not_initialized"
    rpc_code = -32013


class Unavailable(BetterComputeError):
    code = "unavailable"
    rpc_code = -32014


class RateLimited(BetterComputeError):
    """One token (or one anonymous client) has too many calls running: retry shortly."""

    code = "rate_limited"
    rpc_code = -32015


class FellBehind(BetterComputeError):
    """A /watch reader fell further behind than the server buffers: resume with --since."""

    code = "fell_behind"
    rpc_code = -32016


def _error_classes() -> list[type[BetterComputeError]]:
    return [BetterComputeError, *_all_subclasses(BetterComputeError)]


def _all_subclasses(cls: type[BetterComputeError]) -> list[type[BetterComputeError]]:
    out: list[type[BetterComputeError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_codes() -> set[str]:
    """Every stable code of the tree (what ``data.code`` of an error can be)."""
    return {cls.code for cls in _error_classes()}


def error_from_code(code: str, message: str, data: dict[str, Any] | None = None) -> BetterComputeError:
    """Rebuild the error class named by a wire ``code`` (unknown codes stay generic)."""
    for cls in _error_classes():
        if cls.code == code:
            return cls(message, data=data)
    return BetterComputeError(message, data=data)
