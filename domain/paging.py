"""Pages of a list method (``reservations.list``, ``tokens.list``): at most ``MAX_PAGE``
items a call, oldest first, after the item ``after`` (docs/api.md). Pure: the caller looks
the position of ``after`` up in its read model."""

from __future__ import annotations

from collections.abc import Callable

from better_compute.domain.errors import InvalidInput

MAX_PAGE = 1000  # items one list call answers at most (its default)


def page_size(limit: int | None, what: str) -> int:
    """``limit`` when it is 1 to ``MAX_PAGE``; ``MAX_PAGE`` when not given."""
    size = MAX_PAGE if limit is None else limit
    if not 1 <= size <= MAX_PAGE:
        raise InvalidInput(f"limit {limit}: ask for 1 to {MAX_PAGE} {what}s a call, and for "
                           "the next page pass after = the last id of this one")
    return size


def position_after(after: str | None, find: Callable[[str], int | None], what: str,
                   tenant: str) -> int | None:
    """Where the page starts: ``find(after)``, the position of the tenant's ``after``
    (None without one); refused when ``after`` is not one of the tenant's."""
    if after is None:
        return None
    position = find(after)
    if position is None:
        raise InvalidInput(f"after: no {what} {after} of tenant {tenant}: pass the id of the "
                           f"last {what} of the page before")
    return position
