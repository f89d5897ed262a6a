"""The kubelet device plugin API v1beta1 (`api.proto` here): message classes, method paths and constants.

The classes are built at import from the committed descriptor (`descriptor.py`, made by `../regenerate.py`).
The constants are the kubelet's own (`k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/constants.go`).
"""

from __future__ import annotations

from topology.agent.deviceplugin_v1beta1.descriptor import FILE_DESCRIPTOR
from topology.agent.proto import message_classes

VERSION = "v1beta1"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"

REGISTRATION = "v1beta1.Registration"
REGISTER = f"/{REGISTRATION}/Register"
DEVICE_PLUGIN = "v1beta1.DevicePlugin"
GET_DEVICE_PLUGIN_OPTIONS = f"/{DEVICE_PLUGIN}/GetDevicePluginOptions"
LIST_AND_WATCH = f"/{DEVICE_PLUGIN}/ListAndWatch"
GET_PREFERRED_ALLOCATION = f"/{DEVICE_PLUGIN}/GetPreferredAllocation"
ALLOCATE = f"/{DEVICE_PLUGIN}/Allocate"
PRE_START_CONTAINER = f"/{DEVICE_PLUGIN}/PreStartContainer"

_message = message_classes(FILE_DESCRIPTOR, "v1beta1")

DevicePluginOptions = _message("DevicePluginOptions")
RegisterRequest = _message("RegisterRequest")
Empty = _message("Empty")
ListAndWatchResponse = _message("ListAndWatchResponse")
TopologyInfo = _message("TopologyInfo")
NUMANode = _message("NUMANode")
Device = _message("Device")
PreStartContainerRequest = _message("PreStartContainerRequest")
PreStartContainerResponse = _message("PreStartContainerResponse")
PreferredAllocationRequest = _message("PreferredAllocationRequest")
ContainerPreferredAllocationRequest = _message("ContainerPreferredAllocationRequest")
PreferredAllocationResponse = _message("PreferredAllocationResponse")
ContainerPreferredAllocationResponse = _message("ContainerPreferredAllocationResponse")
AllocateRequest = _message("AllocateRequest")
ContainerAllocateRequest = _message("ContainerAllocateRequest")
CDIDevice = _message("CDIDevice")
AllocateResponse = _message("AllocateResponse")
ContainerAllocateResponse = _message("ContainerAllocateResponse")
Mount = _message("Mount")
DeviceSpec = _message("DeviceSpec")
