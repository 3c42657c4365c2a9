"""``GET /api/compute/ready``: whether this process can do its work now (docs/security.md).

``/health`` is liveness (the process answers: restart it when that fails). ``/ready`` is
readiness: 200 when the event store answers (and, on SQLite after a failed write, takes
a write again) and, where this process runs the agents' gateway, the gateway listens;
503 with the reasons otherwise, and from the moment the server is asked to stop (check
``server``: stopping), so that a load balancer sends new calls elsewhere while it finishes. A load balancer takes a 503 replica out of rotation and
puts it back on 200; nothing needs a restart, the server recovers on its own.

The answer names the component and a short reason, never host names or driver
messages (the probe is anonymous); the server's log has the details. The store is
checked by one request at a time and the answer reused for ``CACHE_SECONDS``, so
a flood of probes costs one query a second and cannot make the check time out.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from better_compute.api.store.outage import outage_reason

log = logging.getLogger("better_compute.ready")

READY_TIMEOUT = 5.0  # seconds the store check may take before it counts as a failure
CACHE_SECONDS = 1.0  # an answer of the store check serves the probes of this long
OK = "ok"
STOPPING = "stopping (finishing its calls; send new ones to another replica)"
_KEY = "readiness"


def _check_store(runtime: Any) -> str:
    store = runtime.store
    sql = store.sql()
    try:
        with sql.transaction(commit=False) as cursor:
            cursor.execute("SELECT 1")
        if store.guard.write_failure is not None:
            sql.probe_write()  # a write failed (a full disk): ready once one succeeds
    except Exception as exc:
        reason = outage_reason(exc)
        if reason is None:
            log.exception("the readiness check of the event store failed")
            return "the event store check failed (see the server's log)"
        return f"the event store is unavailable: {reason}"
    if store.guard.write_failure is not None:
        return f"the event store refuses writes: {store.guard.write_failure}"
    return OK


class _StoreCheck:
    """One check at a time; its answer reused for CACHE_SECONDS."""

    def __init__(self) -> None:
        self.answer = OK
        self.at = float("-inf")
        self.running: anyio.Event | None = None

    async def __call__(self, runtime: Any) -> str:
        if time.monotonic() - self.at < CACHE_SECONDS:
            return self.answer
        if self.running is not None:
            await self.running.wait()
            return self.answer
        self.running = anyio.Event()
        try:
            answer = f"the event store did not answer within {READY_TIMEOUT:.0f}s"
            with anyio.move_on_after(READY_TIMEOUT):
                answer = await anyio.to_thread.run_sync(_check_store, runtime,
                                                        abandon_on_cancel=True)
            self.answer, self.at = answer, time.monotonic()
        finally:
            self.running.set()
            self.running = None
        return self.answer


def _gateway(state: Any) -> str | None:
    """None where this process runs no gateway."""
    gateway = state.extra.get("gateway")
    if gateway is None:
        return None
    return OK if gateway.listening else "the agents' gateway is not listening (restarting)"


async def ready(request: Request) -> Response:
    state = request.app.state.bc
    check = state.extra.setdefault(_KEY, _StoreCheck())
    checks = {"store": await check(state.runtime)}
    if state.stopping:  # SIGTERM: out of rotation first (serve.py's drain)
        checks["server"] = STOPPING
    gateway = _gateway(state)
    if gateway is not None:
        checks["gateway"] = gateway
    failing = [f"{name}: {text}" for name, text in checks.items() if text != OK]
    body: dict[str, Any] = {"status": "unavailable" if failing else "ready", "checks": checks}
    if failing:
        body["reason"] = "; ".join(failing)
    return JSONResponse(body, status_code=503 if failing else 200,
                        headers={"cache-control": "no-store"})
