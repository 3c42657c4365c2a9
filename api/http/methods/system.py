"""system.*, rpc.discover and pki.show."""

from __future__ import annotations

from typing import Any

from better_compute.api.http.rpc import Call, discover, method
from better_compute.api.http.schemas import NoParams


@method("system.whoami", NoParams, "The caller: tenant, role, token.")
def whoami(call: Call, _: NoParams) -> dict[str, Any]:
    return call.service.whoami(call.principal)


@method("rpc.discover", NoParams, "Every method with its params schema.", public=True)
def rpc_discover(call: Call, _: NoParams) -> dict[str, Any]:
    return {"methods": discover()}


@method("pki.show", NoParams,
        "Public certificates and the pins servingCaSpkiPin, joinSigningKeyPin, joinEncryptionKeyPin.")
def pki_show(call: Call, _: NoParams) -> dict[str, Any]:
    return call.service.pki_show(call.principal)
