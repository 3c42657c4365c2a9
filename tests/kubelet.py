"""A test kubelet: the kubelet's half of the device-plugin API (v1beta1), over real gRPC.

Both halves come from the same api.proto as bcd's plugin (agent/kubelet/api_pb2*.py):

* the Registration service, served on ``kubelet.sock`` in the device-plugin folder, as the
  kubelet serves it. On Register it does what the kubelet's device manager does: checks the
  API version and that the resource is an extended resource name, dials the plugin at
  ``folder/endpoint``, reads its options and opens ListAndWatch, keeping every list the
  plugin sends (:meth:`Kubelet.wait_list` awaits one that satisfies a condition);
* a client of the plugin's DevicePlugin service for the calls a pod's admission makes:
  :meth:`Kubelet.allocate` and :meth:`Kubelet.preferred`.

:meth:`Kubelet.restart` does to the folder what a restarting kubelet does: the old server
goes, EVERY socket in the folder is removed (the plugin's too), and kubelet.sock is served
afresh. Waits are on conditions with deadlines, never sleeps.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from better_compute.agent.kubelet import api_pb2, api_pb2_grpc
from tests.cluster import Cluster
from tests.support import POLICY, eventually

Devices = dict[str, str]  # device id -> "Healthy" / "Unhealthy"
# The tutorial's pool policy, with the device plugin turned on (resource bcd.dev/gpu).
KUBERNETES_POLICY = {**POLICY, "kubernetes": {}}


@contextlib.contextmanager
def short_tempdir() -> Iterator[Path]:
    """A temp folder with a short path: unix socket paths hold at most 107 bytes, and a
    pytest tmp_path plus BCD_ROOT/var/lib/kubelet/device-plugins/bcd-gpu.sock is longer."""
    folder = Path(tempfile.mkdtemp(prefix="bc-k8s-", dir="/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class Registration:
    version: str
    endpoint: str
    resource_name: str
    preferred_allocation: bool  # the plugin's options, as GetDevicePluginOptions answered


class Kubelet:
    def __init__(self, folder: Path, on_list: Callable[[Devices], None] | None = None) -> None:
        self.folder = folder
        self.socket = folder / "kubelet.sock"
        self.registrations: list[Registration] = []
        self.lists: list[Devices] = []
        self.topology: dict[str, list[int]] = {}
        self.on_list = on_list
        self.refuse: str | None = None  # set: Register is answered with this error
        self.refused = 0
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._stream: Any = None
        self._plugin: Any = None

    # -- the kubelet's life --------------------------------------------------------

    def start(self) -> None:
        """Clean the folder of sockets, as a starting kubelet does, and serve Registration."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in self.folder.iterdir():
            if path.is_socket():
                path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler("v1beta1.Registration", {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=api_pb2.RegisterRequest.FromString,
                response_serializer=api_pb2.Empty.SerializeToString)})
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """The kubelet goes: its server, its socket, its connection to the plugin."""
        if self._server is not None:
            self._server.stop(grace=None).wait(10)
            self._server = None
        self._disconnect()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _disconnect(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # -- Registration (the server half) --------------------------------------------

    def _register(self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
                  ) -> api_pb2.Empty:
        if self.refuse is not None:
            with self._changed:
                self.refused += 1
                self._changed.notify_all()
            context.abort(grpc.StatusCode.UNAVAILABLE, self.refuse)
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"Unsupported version {request.version!r}: v1beta1")
        name = request.resource_name
        if "/" not in name or "kubernetes.io/" in name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"invalid extended resource name {name!r}")
        self._disconnect()
        channel = grpc.insecure_channel(f"unix://{self.folder / request.endpoint}")
        grpc.channel_ready_future(channel).result(timeout=10)
        # the generated stub is untyped (agent/kubelet/api_pb2_grpc.py, as in service.py)
        plugin = api_pb2_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        options = plugin.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        stream = plugin.ListAndWatch(api_pb2.Empty())
        self._channel, self._plugin, self._stream = channel, plugin, stream
        threading.Thread(target=self._follow, args=(stream,), daemon=True).start()
        with self._changed:
            self.registrations.append(Registration(request.version, request.endpoint, name,
                                                   options.get_preferred_allocation_available))
            self._changed.notify_all()
        return api_pb2.Empty()

    def _follow(self, stream: Iterator[api_pb2.ListAndWatchResponse]) -> None:
        try:
            for response in stream:
                devices = {d.ID: d.health for d in response.devices}
                if self.on_list is not None:
                    self.on_list(devices)
                with self._changed:
                    self.lists.append(devices)
                    self.topology = {d.ID: [n.ID for n in d.topology.nodes]
                                     for d in response.devices}
                    self._changed.notify_all()
        except grpc.RpcError:
            pass  # the stream ended: the plugin went, or this kubelet restarted

    # -- waiting -------------------------------------------------------------------

    def _wait(self, check: Callable[[], Any], what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = check()
                if found:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the test kubelet timed out waiting for {what}; "
                                         f"registrations={self.registrations} "
                                         f"lists={self.lists[-3:]}")
                self._changed.wait(left)

    def wait_registration(self, count: int, timeout: float = 30.0) -> Registration:
        """The ``count``-th registration (1 = the first), once it happened."""
        return self._wait(lambda: len(self.registrations) >= count and  # type: ignore[no-any-return]
                          self.registrations[count - 1], f"registration {count}", timeout)

    def wait_refused(self, count: int, timeout: float = 30.0) -> None:
        self._wait(lambda: self.refused >= count, f"{count} refused registrations", timeout)

    def wait_list(self, check: Callable[[Devices], bool], what: str,
                  timeout: float = 30.0) -> Devices:
        """The newest list, once it satisfies ``check``."""
        found = self._wait(lambda: [dict(self.lists[-1])] if self.lists and check(self.lists[-1])
                           else None, what, timeout)
        return found[0]  # type: ignore[no-any-return]

    # -- the plugin's client half --------------------------------------------------

    def allocate(self, ids: list[str]) -> api_pb2.ContainerAllocateResponse:
        response = self._plugin.Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
        allocated: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return allocated

    def preferred(self, available: list[str], size: int,
                  must_include: tuple[str, ...] = ()) -> list[str]:
        response = self._plugin.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
            container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=list(must_include),
                allocation_size=size)]), timeout=10)
        return list(response.container_responses[0].deviceIDs)


@contextlib.contextmanager
def kubelet_on(c: Cluster) -> Iterator[Kubelet]:
    """A kubelet running on the cluster's machine, which then joins and is adopted (bcd node
    running, epoch 1); the kubelet stops at the end."""
    kubelet = Kubelet(c.machine.root / "var/lib/kubelet/device-plugins")
    kubelet.start()
    try:
        c.join()
        c.start_agent(epoch=1)
        eventually(lambda: c.provision_state(c.node) == "adopted", "the node is adopted")
        yield kubelet
    finally:
        kubelet.stop()
