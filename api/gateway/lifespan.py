"""Running the gateway inside ``serve``: a lifespan task beside uvicorn, one event loop."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.abc

from better_compute.api import pki
from better_compute.api.gateway.server import Gateway, gateway_handshakes
from better_compute.api.gateway.tls import server_context
from better_compute.api.settings import env_seconds


def gateway_task(host: str, port: int, hostnames: list[str]) -> Any:
    """A lifespan task that serves the gateway on ``host:port`` until shutdown."""

    async def run(state: Any, *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        runtime = state.runtime

        def build() -> Gateway:
            bundle = pki.unseal_bundle(runtime.service.pki().sealed,
                                       pki.parse_master_key(runtime.master_key_text()))
            context = server_context(bundle, hostnames, runtime.data_dir / "run")
            return Gateway(
                runtime.services, context,
                heartbeat_seconds=env_seconds(runtime.env, "BETTER_COMPUTE_NODE_HEARTBEAT", 5.0),
                hub=state.extra.get("watch_hub"), bundle=bundle,
                handshakes=gateway_handshakes(runtime.env),
            )

        gateway = await anyio.to_thread.run_sync(build)
        state.extra["gateway"] = gateway
        async with anyio.create_task_group() as tg:
            await tg.start(gateway.serve, host, port)
            task_status.started()

    return run
