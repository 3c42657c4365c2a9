"""bcd's kubelet device plugin: held GPUs of kubernetes reservations, as ``bcd.dev/gpu``.

``devices.py`` decides (which GPUs, their health, Allocate's answer, the preferred
allocation) without sockets; ``plugin.py`` serves the kubelet's DevicePlugin service (from
the generated ``api_pb2``/``api_pb2_grpc``) and registers with the kubelet. Importing this
package imports no gRPC: only ``plugin.py`` does, when a pool turns the plugin on.
"""
