"""The GPUs NVIDIA's device plugin gives a pod on a node: what every policy but ours gets inside the node.

go-gpuallocator's best-effort policy (loadtests/gpuallocator_baseline.py: pair scores, partition search), with the
PCIe levels NVML reports for the DGX-1's NVLink pairs, then the kubelet's padding with the lowest free GPUs.
"""

from __future__ import annotations

from functools import cache

from loadtests.gpuallocator_baseline import DGX1V_HIDDEN_PCIE, BestEffortBaseline
from loadtests.replay.boards import BoardKey, board_topology
from topology.compiled import bits


@cache
def gpuallocator(key: BoardKey) -> BestEffortBaseline:
    """go-gpuallocator's pair scores for a board; the DGX-1's with the PCIe levels NVML gives its NVLink pairs."""
    platform, installed = key
    position = {gpu: at for at, gpu in enumerate(installed)}
    hidden = {(position[i], position[j]): level for (i, j), level in DGX1V_HIDDEN_PCIE.items()
              if i in position and j in position} if platform == "dgx1-v100" else None
    return BestEffortBaseline(board_topology(key), hidden)


@cache
def stock_device_plugin(key: BoardKey, free: int, count: int) -> tuple[int, ...]:
    """The GPUs the kubelet gives a container through NVIDIA's device plugin: go-gpuallocator's preferred set,
    then, as the kubelet does where the preference falls short (a padded set, PR #80), the lowest free ones."""
    available = bits(free)
    preferred = gpuallocator(key).search(available, count).gpus or ()
    rest = [gpu for gpu in available if gpu not in preferred]
    return tuple(sorted((*preferred, *rest[:count - len(preferred)])))
