"""JSON-RPC methods, one module per area; api/http/methods/table.py lists them all.

A method is its name, its params Struct and a handler, which takes a ``Call`` and the
decoded params and returns what the answer's ``result`` holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from better_compute.api.http.schemas import Params
from better_compute.api.services.compute import ComputeService
from better_compute.api.services.registry import Services
from better_compute.domain.access import Principal


@dataclass(frozen=True)
class Call:
    services: Services  # built once by the composition root (api/runtime.py)
    principal: Principal

    @property
    def service(self) -> ComputeService:
        return self.services.compute


Handler = Callable[[Call, Any], Any]


@dataclass(frozen=True)
class Method:
    name: str
    params: type[Params]
    handler: Handler
    summary: str
    public: bool = False  # callable without a token
    # Books or frees GPUs: runs in the writers' threads (``writes_hint``, api/http/app.py).
    writes: bool = False

    def schema(self) -> dict[str, Any]:
        return msgspec.json.schema(self.params)
