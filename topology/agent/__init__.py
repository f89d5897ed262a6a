"""`gpu-topology-agent`: publishes this node's GPU topology and GPU state as node annotations (DESIGN §2, §6),
and with `--mode deliver` serves the kubelet device plugin that gives each container the GPUs the extender bound.

One job per module. The pure core imports neither Kubernetes nor gRPC:

| module | job |
|---|---|
| `devices.py` | kubelet device ids -> this node's GPU ids; what pod-resources and NVML health say, as one observation |
| `dra.py` | on a DRA node: claims' devices (`gpu-<minor>`) -> GPU ids by NVML minor and UUID, as one observation |
| `annotation_patch.py` | observation + what the node carries -> the merge patch to send, if any (change or heartbeat) |
| `health.py` | NVML health per GPU (lost, uncorrectable ECC, row-remapping failure) |
| `reporter.py` | the polling loop: observe, plan, patch, wait (`topology/backoff.py` after failures) to an Event |
| `claims.py` | which pod and container a device-plugin call is for, and which GPUs to answer |
| `allocate.py` | Allocate's answer in NVIDIA's device list strategies (envvar, volume-mounts, CDI) |
| `holders.py` | `--holders`: which container holds which GPUs, as pod-resources says, with each set's ring |

The edges, the only modules that import gRPC or the Kubernetes client:

| module | job |
|---|---|
| `podresources.py` | pod-resources v1 (gRPC): List, with DRA claims' devices (bounded), GetAllocatableResources |
| `podresources_v1/` | that API's messages, built from the committed descriptor of `api.proto` |
| `kube.py` | GET and merge-PATCH of this node through the official `kubernetes` client |
| `pods.py` | the pods bound to this node (field selector), bounded, through the same client |
| `deviceplugin.py` | the device plugin API v1beta1 over gRPC: serve, register, re-register, the four calls |
| `dir_watch.py` | inotify on the device-plugins directory (libc through ctypes), so a kubelet restart is seen at once |
| `deviceplugin_v1beta1/` | that API's messages, built from the committed descriptor of `api.proto` |
| `proto.py`, `regenerate.py` | message classes from a committed descriptor; `regenerate.py` remakes the descriptors |
| `cli.py` | argument parsing, wiring, signals, exit codes |
"""
