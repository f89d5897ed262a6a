"""Every bound on what a node may claim about its GPUs, each with the real hardware or Kubernetes limit behind it.

Annotations are written by whoever can patch a Node, and `topo -m` text comes from anywhere, so the model,
the codec and the parser refuse anything outside these bounds instead of scheduling on it. The bounds are
loose enough for every shipping board and tight enough that no value can blow up memory, work or scores.
"""

from __future__ import annotations

import re

from topology import catalog

# The largest single-OS boards ship 16 GPUs (DGX-2, HGX-2); 64 leaves room for PCIe expansion chassis.
MAX_GPUS = 64

# NIC columns of `nvidia-smi topo -m`: a DGX H100 shows 13; one dual-port NIC per GPU on 16 GPUs shows 32.
MAX_NICS = 64


def max_nvlinks(model: str) -> int:
    """NVLink links per pair, and per GPU without NVSwitch: the catalog's link budget for the model (18, the
    most any NVIDIA GPU has, for models it does not know). Only switches show a GPU more peer links."""
    return catalog.max_nvlinks(model)


# PCIe generations 1 to 6 exist; widths are the link widths the PCIe specification defines (x1..x32).
PCIE_GENERATIONS = range(1, 7)
PCIE_WIDTHS = frozenset({1, 2, 4, 8, 16, 32})

# Linux MAX_NUMNODES is at most 1 << 10 (NODES_SHIFT 10).
MAX_NUMA_NODE = 1023

# Linux NR_CPUS is at most 8192, so CPU ids run 0..8191.
MAX_CPU_ID = 8191

# 1 TiB of memory on one GPU: the largest today (B300) has 288 GB.
MAX_MEMORY_MIB = 1 << 20

# GPU UUIDs are 40 characters (GPU-8-4-4-4-12 hex) and MIG UUIDs 44; printable ASCII without spaces, and
# no comma: the bind annotation joins ids with commas.
MAX_ID_LENGTH = 64
ID_PATTERN = re.compile(rf"[!-+\--~]{{1,{MAX_ID_LENGTH}}}")

# NVML names a device in at most 96 bytes (NVML_DEVICE_NAME_V2_BUFFER_SIZE).
MAX_MODEL_LENGTH = 96
MODEL_PATTERN = re.compile(rf"[ -~]{{1,{MAX_MODEL_LENGTH}}}")

# PCI bus ids are domain:bus:device.function, "0000:07:00.0" (NVML pads the domain to 8 hex digits).
BUS_ID_PATTERN = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")

# The state's `observed` may run this far ahead of the extender's clock (NTP keeps nodes within
# milliseconds); further ahead, a dead reporter would keep its node fresh for as long as it likes.
MAX_OBSERVED_AHEAD_SECONDS = 60.0

# `generation` is a Kubernetes-style int64 counter.
MAX_GENERATION = (1 << 63) - 1

# Pods listed in a state: a GPU shared by time-slicing can be held by a few pods at once.
MAX_STATE_PODS = 4 * MAX_GPUS

# namespace (63) + "/" + name (253), as Kubernetes bounds them.
MAX_POD_KEY_LENGTH = 317

# Annotation sizes: a 16-GPU board encodes in about 5 KiB; 64 GPUs held by 64 pods with the longest names fit.
TOPOLOGY_MAX_BYTES = 16 * 1024
STATE_MAX_BYTES = 32 * 1024


# A day: the longest topology wait, from --topology-wait or a pod's gpu-topology.io/topology-wait
# (extender/verbs/wait.py); a longer one would hold drained GPUs back past any wait a training job accepts.
MAX_TOPOLOGY_WAIT_SECONDS = 86_400

# A pod's spec.activeDeadlineSeconds, as kube-apiserver admits it: a positive int32 (ValidatePodSpec), 68 years.
MAX_ACTIVE_DEADLINE_SECONDS = 2**31 - 1


# A DNS subdomain (RFC 1123) as Kubernetes checks names: an annotation prefix, a DRA driver, a node.
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def valid_id(value: str) -> bool:
    return ID_PATTERN.fullmatch(value) is not None


# Members of one group (gpu-topology.io/group-size): 1,024 pods of 8 GPUs fill the largest NVLink domain NVIDIA
# sells (576 GPUs) nearly twice over, and a leaf block of 128 HGX nodes once.
MAX_GROUP_SIZE = 1024

# An NVLink domain is `<clusterUUID>.<cliqueId>` (GFD's nvidia.com/gpu.clique): a 36-character UUID, a dot and a
# uint32. A label value is at most 63 characters, which also bounds a --topology-levels value.
MAX_DOMAIN_LENGTH = 63

# NVML's fabric cliqueId is an unsigned int (nvmlGpuFabricInfo_t), so a domain's clique id runs 0 to 2**32 - 1.
MAX_CLIQUE_ID = 2**32 - 1

# Why a node has no NVLink domain (topology/fabric.py), as the agent writes it and the extender shows it: one
# line, room for two domains side by side and a GPU or a label to blame.
MAX_DOMAIN_PROBLEM_LENGTH = 256

# DRA objects (resource.k8s.io/v1), as kube-apiserver v1.36 validates them (k8s.io/api/resource/v1/types.go):
# devices in one ResourceSlice, attributes and capacities of one device, taints of one device, results of one
# claim's allocation, entries of its reservedFor; names are a DNS label (device), a DNS subdomain of at most 63
# (driver) and of at most 253 (pool, one node's name for NVIDIA's driver).
MAX_SLICE_DEVICES = 128
MAX_DEVICE_ATTRIBUTES = 32
MAX_DEVICE_TAINTS = 16
MAX_ALLOCATION_RESULTS = 32
MAX_FIRST_AVAILABLE = 8
MAX_DEVICE_SELECTORS = 32  # DeviceSelectorsMaxSize
MAX_PIN_EXPRESSION = 10 * 1024  # CELSelectorExpressionMaxLength
MAX_DEVICE_COUNT = 2**31 - 1  # a request's count is an int64 there; no pool holds more than this
MAX_RESERVED_FOR = 256
MAX_DEVICE_NAME_LENGTH = 63
MAX_DRIVER_NAME_LENGTH = 63
MAX_POOL_NAME_LENGTH = 253
# Slices in one pool: NVIDIA's driver publishes one (one per GPU and one of counters with DynamicMIG); 1,024 is
# far past any node. Slices the extender keeps in all: 16 a node on a 5,000-node cluster, with room.
MAX_POOL_SLICES = 1024
MAX_SLICES = 100_000
# Claims a pod names (spec.resourceClaims, which only etcd's object size bounds), and claims the extender keeps:
# a claim or two per GPU pod, on a 5,000-node cluster with 110 pods a node.
MAX_POD_CLAIMS = 128
MAX_CLAIMS = 1_100_000
# A DRA device attribute's string value (DeviceAttributeMaxValueLength).
DEVICE_ATTRIBUTE_MAX_LENGTH = 64
# pod-resources' dynamic resources, as the kubelet lists them per container: the claims of its pod it uses, and the
# claim of its extended resources (DRAExtendedResource); each with at most its allocation's devices. A claim is in
# its pod's namespace (a DNS label, 63) and named as any object (a DNS subdomain, 253).
MAX_CONTAINER_CLAIMS = MAX_POD_CLAIMS + 1
MAX_NAMESPACE_LENGTH = 63
MAX_NAME_LENGTH = 253
