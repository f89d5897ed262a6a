"""What a job's collectives cost where it lands: the multi-node all-reduce figures and the step-time model.

One place for them, so that the extender's choice between waiting and splitting, the replay's run times
(loadtests/replay/runtime.py) and the demo's figures all read the same numbers.

A job spends a share `c` of its step time in all-reduce at its best placement (its communication share). Where
its all-reduce gets `got` GB/s instead of `best`, it runs `(1 - c) + c * best / got` times as long. Pollux's
simulator models step times by placement this way; communication is 30 to 50% of an LLM training step, and
measured slowdowns of spread placements are 1.5x to 2.35x (Gavel, V100, median 2.35x; Pollux, BERT, 1.5x to 2.2x).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

COMM_SHARE = 0.3
"""The communication share assumed of a job that states none: the low end of an LLM training step's."""

_SHARE = re.compile(r"0(\.[0-9]{1,2})?|1(\.0{1,2})?")


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """All-reduce bus bandwidth per GPU (nccl-tests busbw, GB/s) of a group inside one NVLink domain and across
    domains within one leaf, with where each figure comes from."""

    domain_gbps: float
    leaf_gbps: float
    source: str


ALLREDUCE: Mapping[str, Bandwidth] = {
    "gb200-node": Bandwidth(
        811.0, 85.0,
        "measured: nccl-tests all_reduce busbw of 2 nodes x 4 GB200, 811 GB/s over multi-node NVLink and 85 GB/s "
        "over InfiniBand (lixueduan.com/posts/ai/13-gb200-mnnvl-nccl-test); NVIDIA states 1.8 TB/s per GPU in "
        "the rack (docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/dra-cds.html) and each GPU has "
        "one 400 Gb/s NIC (~50 GB/s) across racks"),
    "dgx-h100": Bandwidth(
        480.0, 440.0,
        "measured: 8 H100 on one NVSwitch board reach 480 GB/s busbw with NVLink SHARP (NVIDIA GTC S62129, as "
        "quoted in NVIDIA/nccl#1374); 2 nodes x 8 H100 over 8 x 400 Gb/s InfiniBand reach 440 GB/s "
        "(coreweave/nccl-tests#92)"),
}
"""Keyed by the board names of topology/platforms.py."""


def slowdown(comm_share: float, best_gbps: float, got_gbps: float) -> float:
    """(1 - c) + c * best / got; a placement with no bandwidth at all never finishes."""
    if got_gbps <= 0:
        return math.inf
    return (1 - comm_share) + comm_share * best_gbps / got_gbps


def split_slowdown(comm_share: float) -> float:
    """How much longer a group split across NVLink domains may run than one kept in a domain: the worst of the
    platforms above, so that a group never splits where the split could cost it more than the wait it saves."""
    return max(slowdown(comm_share, figures.domain_gbps, figures.leaf_gbps) for figures in ALLREDUCE.values())


def parse_comm_share(text: str) -> float:
    """A pod's stated communication share: a decimal from 0 to 1 with at most two places ("0", "0.3", "1")."""
    if not _SHARE.fullmatch(text):
        raise ValueError(f"{text[:40]!r} is not a share from 0 to 1 with at most two decimals, such as 0.3")
    return float(text)
