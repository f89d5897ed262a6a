"""`gpu-topology-agent`: publishes this node's GPU topology and GPU state as node annotations (DESIGN §2, §6).

One job per module. The pure core imports neither Kubernetes nor gRPC:

| module | job |
|---|---|
| `devices.py` | kubelet device ids -> this node's GPU ids; what pod-resources and NVML health say, as one observation |
| `plan.py` | observation + what the node carries -> the merge patch to send, if any (change or heartbeat) |
| `backoff.py` | jittered exponential delays with a cap |
| `health.py` | NVML health per GPU (lost, uncorrectable ECC, row-remapping failure) |
| `loop.py` | the polling loop: observe, plan, patch, wait; stops on an Event |

The edges, each the only importer of its library:

| module | job |
|---|---|
| `podresources.py` | the kubelet's pod-resources API v1 over its unix socket (gRPC): List, GetAllocatableResources |
| `podresources_v1/` | that API's messages, built from the committed descriptor of `api.proto` |
| `kube.py` | GET and merge-PATCH of this node through the official `kubernetes` client |
| `cli.py` | argument parsing, wiring, signals, exit codes |
"""
