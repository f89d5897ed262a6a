"""The kubelet pod-resources API v1 (`api.proto` here): message classes and method paths.

The classes are built at import from the committed descriptor (`descriptor.py`, made by `regenerate.py`)
in a private descriptor pool, so they clash with no other copy of the same `v1` package a process may load.
The gRPC method paths are those the kubelet serves: `/v1.PodResourcesLister/<method>`.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from topology.agent.podresources_v1.descriptor import FILE_DESCRIPTOR

SERVICE = "v1.PodResourcesLister"
LIST = f"/{SERVICE}/List"
GET_ALLOCATABLE_RESOURCES = f"/{SERVICE}/GetAllocatableResources"

_pool = descriptor_pool.DescriptorPool()
_pool.Add(descriptor_pb2.FileDescriptorProto.FromString(FILE_DESCRIPTOR))


def _message(name: str) -> type:
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"v1.{name}"))


ListPodResourcesRequest = _message("ListPodResourcesRequest")
ListPodResourcesResponse = _message("ListPodResourcesResponse")
AllocatableResourcesRequest = _message("AllocatableResourcesRequest")
AllocatableResourcesResponse = _message("AllocatableResourcesResponse")
PodResources = _message("PodResources")
ContainerResources = _message("ContainerResources")
ContainerDevices = _message("ContainerDevices")
TopologyInfo = _message("TopologyInfo")
NUMANode = _message("NUMANode")
