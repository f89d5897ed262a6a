"""The kubelet pod-resources API v1 (`api.proto` here): message classes and method paths.

The classes are built at import from the committed descriptor (`descriptor.py`, made by `../regenerate.py`).
The gRPC method paths are those the kubelet serves: `/v1.PodResourcesLister/<method>`.
"""

from __future__ import annotations

from topology.agent.podresources_v1.descriptor import FILE_DESCRIPTOR
from topology.agent.proto import message_classes

SERVICE = "v1.PodResourcesLister"
LIST = f"/{SERVICE}/List"
GET_ALLOCATABLE_RESOURCES = f"/{SERVICE}/GetAllocatableResources"

_message = message_classes(FILE_DESCRIPTOR, "v1")

ListPodResourcesRequest = _message("ListPodResourcesRequest")
ListPodResourcesResponse = _message("ListPodResourcesResponse")
AllocatableResourcesRequest = _message("AllocatableResourcesRequest")
AllocatableResourcesResponse = _message("AllocatableResourcesResponse")
PodResources = _message("PodResources")
ContainerResources = _message("ContainerResources")
ContainerDevices = _message("ContainerDevices")
TopologyInfo = _message("TopologyInfo")
NUMANode = _message("NUMANode")
DynamicResource = _message("DynamicResource")
ClaimResource = _message("ClaimResource")
CDIDevice = _message("CDIDevice")
