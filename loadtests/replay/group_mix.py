"""The nvl72 fleet's synthetic workload: multi-node jobs beside single pods, in an assumed mix.

No public trace gives pods per job on NVLink-domain hardware, so the mix is an assumption, written down here and
in the output: most jobs are small while multi-node jobs hold most of the GPU-time, as GPU cluster traces
commonly report. On GB200 a pod is one compute tray (4 GPUs), jobs of 1 to 18 pods (up to one NVL72 rack);
on HGX H100, single pods of 1 to 8 GPUs and jobs of 2 to 8 nodes of 8 GPUs. Durations follow the Alibaba
trace's lognormal (workloads.py), one per job, and arrivals are Poisson, rescaled to the target load.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from loadtests.replay.clusters import pool_capacity
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.workloads import TRACE_DURATION_MU, TRACE_DURATION_SIGMA, at_load

GROUP_MIX: Mapping[str, Mapping[tuple[int, int], int]] = {
    "GB200": {(1, 4): 40, (2, 4): 20, (4, 4): 15, (8, 4): 12, (12, 4): 5, (16, 4): 5, (18, 4): 3},
    "H100": {(1, 1): 30, (1, 2): 10, (1, 4): 10, (1, 8): 20, (2, 8): 15, (4, 8): 10, (8, 8): 5},
}
"""Per pool, (pods, GPUs per pod): weight. An assumption, not a trace statistic."""


def mix_note(mix: Mapping[str, Mapping[tuple[int, int], int]] = GROUP_MIX) -> str:
    """The mix in words, for the output: per pool, pods x GPUs and weight."""
    return "assumed mix (not a trace statistic), pods x GPUs per pod: weight; " + "; ".join(
        f"{pool} " + ", ".join(f"{pods} x {gpus}: {weight}" for (pods, gpus), weight in sorted(shapes.items()))
        for pool, shapes in sorted(mix.items()))


def group_workload(cluster: Sequence[ClusterNode], load: float, jobs: int = 2000, seed: int = 0,
                   mix: Mapping[str, Mapping[tuple[int, int], int]] = GROUP_MIX) -> tuple[Job, ...]:
    """`jobs` jobs of the mix at exactly the target offered load. Each job picks a pool of the cluster in
    proportion to its capacity over its mean GPUs per job, so every pool sees the target load in expectation;
    a job of several pods is a group of member Jobs (model.py)."""
    if not 1 <= jobs <= 100_000:
        raise ValueError(f"jobs must be 1 to 100,000, not {jobs}")
    capacity = pool_capacity(cluster)
    pools = sorted(pool for pool in capacity if pool in mix)
    if not pools:
        raise ValueError(f"the cluster has none of the mix's pools ({', '.join(sorted(mix))})")
    mean_gpus = {pool: sum(pods * gpus * weight for (pods, gpus), weight in mix[pool].items())
                 / sum(mix[pool].values()) for pool in pools}
    rng = random.Random(seed)
    drawn: list[Job] = []
    submit = 0.0
    for index in range(jobs):
        pool = rng.choices(pools, weights=[capacity[pool] / mean_gpus[pool] for pool in pools])[0]
        shapes = sorted(mix[pool])
        pods, gpus = rng.choices(shapes, weights=[mix[pool][shape] for shape in shapes])[0]
        submit += rng.expovariate(1.0)
        duration = rng.lognormvariate(TRACE_DURATION_MU, TRACE_DURATION_SIGMA)
        name = f"nvl-{index:06d}"
        if pods == 1:
            drawn.append(Job(name, submit, duration, gpus, pool))
        else:
            drawn += [Job(f"{name}-{member}", submit, duration, gpus, pool, group=name, pods=pods)
                      for member in range(pods)]
    return at_load(drawn, cluster, load)
