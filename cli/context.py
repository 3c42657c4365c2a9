"""What every command gets: the environment, a lazily made client, the output options."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from better_compute.cli.client import Client, make_client
from better_compute.cli.output import emit


@dataclass
class Context:
    env: Mapping[str, str]
    args: argparse.Namespace
    _client: Client | None = field(default=None, repr=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = make_client(self.env)
        return self._client

    def call(self, method: str, **params: Any) -> Any:
        return self.client.call(method, {k: v for k, v in params.items() if v is not None})

    def emit(self, value: Any) -> None:
        emit(value, query=getattr(self.args, "query", None), output=getattr(self.args, "output", None))

    @property
    def tenant(self) -> str | None:
        return getattr(self.args, "tenant", None) or self.env.get("BETTER_COMPUTE_TENANT") or None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
