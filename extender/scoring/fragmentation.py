"""Fragmentation: the links the choice strands, i.e. free GPUs that lose their best partner among the free.

Breaking the last free NVLink pair on a node leaves one GPU that no later multi-GPU pod can use at NVLink speed;
a GPU taken from a PCIe-only node where every free GPU keeps an equal partner strands nothing. Measuring the
cut (all bandwidth between the pod and the free GPUs) could not tell those apart: both cut tens of GB/s
(issue 10, the RTX A6000 / L40S case).
"""

from __future__ import annotations

from topology.compiled import CompiledTopology


def stranded_gbps(compiled: CompiledTopology, free: int, chosen: int) -> float:
    """Over the GPUs left free, the bandwidth each loses to its best free partner once `chosen` is taken."""
    mbps = compiled.mbps
    before = [gpu for gpu in range(compiled.size) if free >> gpu & 1]
    after = [gpu for gpu in before if not chosen >> gpu & 1]
    lost = sum(max((mbps[gpu][other] for other in before if other != gpu), default=0)
               - max((mbps[gpu][other] for other in after if other != gpu), default=0) for gpu in after)
    return lost / 1000


def fragmentation_score(stranded: float, most_stranded: float) -> float:
    """1.0 for a choice that strands nothing, down to 0.0 for the one that strands most among the candidates."""
    if most_stranded <= 0:
        return 1.0
    return 1.0 - stranded / most_stranded
