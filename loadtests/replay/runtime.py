"""How long a job runs where it landed (issue 29): its duration scaled by the bandwidth its placement gives.

A job's `duration_s` is its run time at its best placement. Where it landed it runs
`duration_s * slowdown`, `slowdown = (1 - c) + c * best / got`: the share `c` of its time spent in all-reduce
(`--comm-share`) stretches by how much slower its placement's all-reduce is than its best one's. `c = 0` gives
every job its duration, as the replay did before this model. The same model applies to every policy.

- A pod on its own: `got` is the ring of its GPU set on its node's board (topology.select.ring_gbps); `best` the
  best ring of as many GPUs on an empty board of its pool. One GPU has no ring and runs its duration.
- A group: `got` is its slowest level (spans.allreduce_gbps: inside one NVLink domain, else its leaf or spine
  network); `best` the same at the narrowest span one empty block of which holds the whole group
  (Spans.tightest). A group across NVLink domains in intact segments pays only its between-segment traffic
  (`segmented_gbps`).

Segments: NCCL reduces inside each NVLink domain first, then across domains on a shard, so the network carries
1/s of what a flat ring would, s being the trays a segment has in one domain (the largest s that divides every
domain's count of members: equal segments, as Slurm's `--segment` makes them). Per byte an all-reduce then costs
`1/domain + (1/s) * (1/network - 1/domain)`: at s = 1 the measured network figure (which already includes a
tray's own NVLink), towards the domain's as s grows. A group of 8 trays in 2 racks of 4 gets 259 GB/s, against
85 GB/s scattered tray by tray and 811 GB/s in one rack. The s = 1 point is measured; the scaling is the
hierarchical algorithm's arithmetic, not a measurement.

The formula, the default `c` (0.3) and the bandwidth figures are topology/collectives.py's, which the extender
reads too: at 0.3 a group scattered over InfiniBand instead of one NVL72 domain (85 against 811 GB/s) runs 3.6x its
duration. Tiresias's and Gavel's simulators ignore placement.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from functools import cache

from loadtests.replay.boards import BoardKey, board, board_key
from loadtests.replay.engine import Placement
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.spans import Span, Spans, allreduce_gbps
from topology.collectives import ALLREDUCE, COMM_SHARE, slowdown
from topology.select import Choice, Request, Selector, ring_gbps

@cache
def best_ring_gbps(key: BoardKey, gpus: int) -> float:
    """The best ring a pod of this size gets on an empty node of the same board."""
    compiled = board(key)
    choice = Selector().select(compiled, compiled.full_mask, Request(gpus))
    assert isinstance(choice, Choice) and choice.ring_gbps is not None, (key, gpus)
    return choice.ring_gbps


def segmented_gbps(platform: str, span: Span, segment: int) -> float:
    """The all-reduce bandwidth of a group of `platform` nodes across `span`, in segments of `segment` nodes each
    inside one NVLink domain: only the between-segment share crosses the network."""
    network = allreduce_gbps(platform, span)
    if span is Span.DOMAIN or segment <= 1:
        return network
    domain = ALLREDUCE[platform].domain_gbps
    return 1 / (1 / domain + (1 / network - 1 / domain) / segment)


class RunTime:
    """The run-time model of one fleet: `seconds(job, placements)` for the engine, `bandwidths` for the metrics."""

    def __init__(self, nodes: Sequence[ClusterNode], comm_share: float = COMM_SHARE) -> None:
        if not 0 <= comm_share <= 1:
            raise ValueError(f"the communication share must be within 0..1, not {comm_share}")
        self.comm_share = comm_share
        self.spans = Spans(nodes)
        self._key = {node.name: board_key(node) for node in nodes}
        self._pool_keys: dict[str | None, set[BoardKey]] = {None: set(self._key.values())}
        for node in nodes:
            self._pool_keys.setdefault(node.gpu_model, set()).add(self._key[node.name])
        self._best: dict[tuple[str | None, int], float] = {}  # (pool, GPUs) -> the best ring on an empty board

    def bandwidths(self, job: Job, placements: Sequence[Placement]) -> tuple[float, float] | None:
        """(best, got) all-reduce bandwidth of the job where it landed; None where it does not communicate (one
        GPU on its own)."""
        if job.group is not None:
            nodes = [placement.node for placement in placements]
            platforms = {self.spans.platform[node] for node in nodes}
            best = min(allreduce_gbps(platform, self.spans.tightest(job)) for platform in platforms)
            span, segment = self.spans.span_of(nodes), math.gcd(*Counter(
                self.spans.blocks[node][Span.DOMAIN] for node in nodes).values())
            return best, min(segmented_gbps(platform, span, segment) for platform in platforms)
        (placement,) = placements
        if len(placement.gpus) < 2:
            return None
        gpus = len(placement.gpus)
        best = self._best.get((job.gpu_model, gpus))
        if best is None:
            keys = self._pool_keys.get(job.gpu_model, set())
            best = self._best[(job.gpu_model, gpus)] = max(best_ring_gbps(key, gpus) for key in keys
                                                           if board(key).size >= gpus)
        return best, ring_gbps(board(self._key[placement.node]), placement.gpus) or 0.0

    def seconds(self, job: Job, placements: Sequence[Placement]) -> float:
        """How long the job runs from its start where it landed: a group's members, once all are placed."""
        if self.comm_share == 0 or not math.isfinite(job.duration_s):
            return job.duration_s
        found = self.bandwidths(job, placements)
        return job.duration_s if found is None else job.duration_s * slowdown(self.comm_share, *found)
