"""The gRPC side of the device plugin: the DevicePlugin service, and Register with the kubelet.

Everything here speaks the kubelet's own v1beta1 API through the stubs generated from its
api.proto (``api_pb2``, ``api_pb2_grpc``), with ``grpc.aio`` on bcd's event loop. The
decisions come from devices.py; what to list comes from :class:`~.plugin.DevicePlugin`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import grpc
import grpc.aio

from . import api_pb2, api_pb2_grpc
from .devices import KubeletDevice, NotHeld, allocate, preferred

if TYPE_CHECKING:
    from .plugin import DevicePlugin

API_VERSION = "v1beta1"
REGISTER_TIMEOUT_S = 10.0


def _device(device: KubeletDevice) -> api_pb2.Device:
    topology = None
    if device.numa_node is not None:
        topology = api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=device.numa_node)])
    return api_pb2.Device(ID=device.id, health=device.health, topology=topology)


class DevicePluginService:
    """The DevicePlugin service the kubelet calls on bcd-gpu.sock."""

    def __init__(self, plugin: DevicePlugin, resource: str) -> None:
        self.plugin = plugin
        self.resource = resource

    async def GetDevicePluginOptions(self, request: api_pb2.Empty, context: Any
                                     ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False,
                                           get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
                           ) -> None:
        """The current list now, and a new one whenever it changes, until the kubelet leaves."""
        with self.plugin.stream() as stream:
            while True:
                changed = self.plugin.changed()
                version, devices = self.plugin.version, list(self.plugin.devices)
                await context.write(api_pb2.ListAndWatchResponse(
                    devices=[_device(device) for device in devices]))
                stream.sent(version)
                await changed.wait()

    async def GetPreferredAllocation(self, request: api_pb2.PreferredAllocationRequest,
                                     context: Any) -> api_pb2.PreferredAllocationResponse:
        devices = list(self.plugin.devices)
        return api_pb2.PreferredAllocationResponse(container_responses=[
            api_pb2.ContainerPreferredAllocationResponse(deviceIDs=preferred(
                list(req.available_deviceIDs), list(req.must_include_deviceIDs),
                req.allocation_size, devices))
            for req in request.container_requests])

    async def Allocate(self, request: api_pb2.AllocateRequest,
                       context: grpc.aio.ServicerContext[Any, Any]) -> api_pb2.AllocateResponse:
        devices = list(self.plugin.devices)
        answers = []
        for req in request.container_requests:
            try:
                grant = allocate(list(req.devices_ids), devices, self.resource)
            except NotHeld as exc:
                self.plugin.say(f"kubelet: Allocate refused: {exc}")
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            answers.append(api_pb2.ContainerAllocateResponse(
                envs=grant.envs,
                cdi_devices=[api_pb2.CDIDevice(name=name) for name in grant.cdi_devices]))
        return api_pb2.AllocateResponse(container_responses=answers)

    async def PreStartContainer(self, request: api_pb2.PreStartContainerRequest, context: Any
                                ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


@contextlib.asynccontextmanager
async def serving(plugin: DevicePlugin, resource: str, path: Path) -> AsyncIterator[None]:
    """Serve the DevicePlugin service on the unix socket ``path`` until the block ends.

    A socket left at ``path`` (a killed bcd) is replaced; on the way out the server stops
    at once (the kubelet's streams end) and the socket is removed if it is still ours.
    """
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
        DevicePluginService(plugin, resource), server)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        server.add_insecure_port(f"unix://{path}")
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {path}: {exc}") from None
    await server.start()
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            await server.stop(grace=None)


async def register(kubelet_socket: Path, endpoint: str, resource: str) -> None:
    """Register with the kubelet; raises OSError saying why it refused or did not answer."""
    request = api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource,
        options=api_pb2.DevicePluginOptions(pre_start_required=False,
                                            get_preferred_allocation_available=True))
    async with grpc.aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise OSError(f"{exc.code().name}: {exc.details()}") from None
