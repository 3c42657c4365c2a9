"""What every command gets: the environment, a lazily made client, the output options.

Every command's runner takes a ``Context`` (cli/registry.py ``Runner``). The waiting loops
take only what they use of it, ``Caller`` (and ``Waiter``, with the environment), so a test
can hand them a fake server.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from better_compute.cli.client import Client
    from better_compute.cli.tables import Table

PAGE = 1000  # items asked for per call of a paged list method (the most a call answers)


class Caller(Protocol):
    """Calls the API as the command's tenant."""

    @property
    def tenant(self) -> str | None: ...

    def call(self, method: str, **params: Any) -> Any: ...


class Waiter(Caller, Protocol):
    """A ``Caller`` that also reads the environment (is there a server to wait on?)."""

    @property
    def env(self) -> Mapping[str, str]: ...


class Context:
    def __init__(self, env: Mapping[str, str], args: argparse.Namespace) -> None:
        self.env = env
        self.args = args
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            from better_compute.cli.client import make_client

            self._client = make_client(self.env)
        return self._client

    def call(self, method: str, **params: Any) -> Any:
        return self.client.call(method, {k: v for k, v in params.items() if v is not None})

    def call_pages(self, method: str, **params: Any) -> list[Any]:
        """Every item of a paged list method (``reservations.list``, ``tokens.list``): pages
        of ``PAGE``, each after the last id of the one before, until a shorter page."""
        items: list[Any] = []
        after = None
        while True:
            page = self.call(method, **params, limit=PAGE, after=after)
            items.extend(page)
            if len(page) < PAGE:
                return items
            after = page[-1]["id"]

    @property
    def output(self) -> str | None:
        return getattr(self.args, "output", None)

    def emit(self, value: Any, table: Table | None = None) -> None:
        from better_compute.cli.output import emit

        emit(value, query=getattr(self.args, "query", None), output=self.output, table=table)

    def list_scope(self) -> dict[str, Any]:
        """A list method's tenant params: ``allTenants`` with -A (and only an explicit
        --tenant, which the server refuses beside it), else the command's tenant."""
        if getattr(self.args, "all_tenants", False):
            return {"allTenants": True, "tenantId": getattr(self.args, "tenant", None)}
        return {"tenantId": self.tenant}

    def list_table(self, table: Table) -> Table:
        """``table``, with TENANT as its first column under -A (kubectl's NAMESPACE)."""
        if not getattr(self.args, "all_tenants", False):
            return table
        from better_compute.cli.tables import with_tenant

        return with_tenant(table)

    @property
    def tenant(self) -> str | None:
        return getattr(self.args, "tenant", None) or self.env.get("BETTER_COMPUTE_TENANT") or None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
