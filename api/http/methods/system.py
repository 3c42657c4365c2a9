"""system.whoami and pki.show."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.methods import Call
from better_compute.api.http.schemas import NoParams


def whoami(call: Call, _: NoParams) -> dict[str, Any]:
    return call.service.whoami(call.principal)


def pki_show(call: Call, _: NoParams) -> dict[str, Any]:
    return call.service.pki_show(call.principal)
