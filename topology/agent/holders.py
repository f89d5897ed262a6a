"""Which container holds which GPUs on this node, as the kubelet says (pod-resources), for people.

`gpu-topology-agent --holders` prints it: each container's GPUs by index, the best ring through them, and
the GPUs no container holds. It is the node's side of what the extender decided: with the agent delivering,
each line matches the pod's `gpu-topology.io/containers` annotation.
"""

from __future__ import annotations

from topology.agent.claims import Listed
from topology.agent.devices import MIG, GpuIds
from topology.compiled import compile_topology
from topology.model import Topology
from topology.select import ring_gbps


def holders_table(topology: Topology, listed: Listed) -> str:
    ids = GpuIds(topology)
    compiled = compile_topology(topology)
    index = {gpu: position for position, gpu in enumerate(ids.ids)}
    rows = [("POD", "CONTAINER", "GPUS", "RING GB/S", "GPU IDS")]
    held: set[int] = set()
    for (namespace, pod), containers in sorted(listed.items()):
        for container, devices in sorted(containers.items()):
            if not devices:
                continue
            gpus = [ids.resolve(device) for device in devices]
            known = sorted({index[gpu] for gpu in gpus if gpu is not None and gpu != MIG})
            held |= set(known)
            ring = ring_gbps(compiled, known)
            strange = [device for device, gpu in zip(devices, gpus, strict=True) if gpu is None or gpu == MIG]
            rows.append((f"{namespace}/{pod}", container, ",".join(map(str, known)) or "-",
                         "-" if ring is None else f"{ring:g}",
                         ",".join(ids.ids[i] for i in known) + (f" (not GPUs of this node: {','.join(strange)})"
                                                               if strange else "")))
    free = [i for i in range(topology.size) if i not in held]
    rows.append(("(no container)", "", ",".join(map(str, free)) or "-", "", ""))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
                     for row in rows).rstrip() + "\n"
