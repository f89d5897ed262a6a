"""kube-scheduler v1.36's node scores, as its source computes them, so the replay's node choice is the one a real
scheduler would make, extender included.

From kubernetes/kubernetes pkg/scheduler (read, not copied):
- NodeResourcesFit (framework/plugins/noderesources): per scored resource, with the pod's request added to the
  node's, LeastAllocated gives (allocatable - requested) * 100 / allocatable and MostAllocated
  min(requested, allocatable) * 100 / allocatable, both in integer arithmetic; the node score is
  sum(score * weight) / sum(weight). The default resources are cpu and memory, weight 1 each: out of the box
  nvidia.com/gpu is counted by the filter but never scored. An extended resource that the pod does not request
  is skipped.
- NodeResourcesBalancedAllocation: (1 - std) * 100 over the requested fractions of cpu and memory (capped at 1;
  with two resources std = |f1 - f2| / 2), truncated to an integer.
- schedule_one.go numFeasibleNodesToFind and findNodesThatPassFilters: with 100 nodes or more, the filters stop
  once they have found percentageOfNodesToScore of all nodes as feasible (default 0: adaptive, 50 - nodes / 125
  percent, at least 5 percent and at least 100 nodes), starting where the previous pod's search stopped. Only
  those nodes are scored and sent to the extender.
- schedule_one.go prioritizeNodes: each score plugin's score times its weight (both plugins weigh 1 by
  default), plus, per interested extender, its 0-10 score times the extender's weight times
  MaxNodeScore / MaxExtenderPriority = 10. selectHost takes a node with the highest total, uniformly at random
  among ties.

The plugins a GPU job leaves flat (TaintToleration, NodeAffinity and InterPodAffinity without preferences,
ImageLocality with the image everywhere or nowhere, PodTopologySpread's system defaults, which select only pods
of Services and ReplicaSets) add the same to every node and are left out.

The replay's jobs carry GPUs only, so a pod's cpu and memory are taken in proportion to its GPUs (the node's
share per GPU, as GPU jobs are usually sized): every fraction then equals the GPU fraction, BalancedAllocation
is 100 on every node, and NodeResourcesFit ranks nodes by GPU share alone, in whichever direction its strategy
says. `score_node` takes any requests, for callers with real cpu and memory.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal


MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
GPU = "nvidia.com/gpu"
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
CPU_MILLI_PER_GPU = 12_000
MEMORY_MIB_PER_GPU = 131_072
SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "scheduler-config" / "kube-scheduler-config.yaml"

Strategy = Literal["LeastAllocated", "MostAllocated"]


@dataclass(frozen=True, slots=True)
class Profile:
    """The scoring half of a KubeSchedulerConfiguration profile, as far as GPU jobs feel it."""

    name: str
    strategy: Strategy
    resources: tuple[tuple[str, int], ...]
    """NodeResourcesFit's scored resources and their weights."""
    balanced: bool
    """NodeResourcesBalancedAllocation enabled (it scores cpu and memory)."""
    extender_weight: int | None = None
    """The extender's weight; None: no extender."""
    percentage_of_nodes_to_score: int = 0
    """0: kube-scheduler's adaptive default."""


DEFAULT = Profile("kube-scheduler defaults", "LeastAllocated", (("cpu", 1), ("memory", 1)), True)
GPU_PACKING = Profile("MostAllocated on nvidia.com/gpu", "MostAllocated",
                      ((GPU, 10), ("cpu", 1), ("memory", 1)), True)
"""Policy (2): the usual GPU packing setting, NodeResourcesFit MostAllocated with nvidia.com/gpu added to its
resources at weight 10 (as NVIDIA's and most bin-packing guides configure it); everything else as the defaults."""


def shipped_profile(path: Path = SHIPPED_CONFIG, name: str = "gpu-topology-scheduler") -> Profile:
    """A profile scheduler-config/ deploys with our extender (`name`: gpu-topology-scheduler-groups for groups'
    members), read from the file so the replay follows it."""
    import yaml  # the harness extra; imported here so that the soak can use this module's node count without it

    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    profile = next(profile for profile in config["profiles"] if profile["schedulerName"] == name)
    disabled = {entry["name"] for entry in profile.get("plugins", {}).get("multiPoint", {}).get("disabled", [])}
    fit = next(entry["args"] for entry in profile.get("pluginConfig", []) if entry["name"] == "NodeResourcesFit")
    strategy = fit["scoringStrategy"]
    extender = config["extenders"][0]
    return Profile(f"shipped ({path.name}, {name})", strategy["type"],
                   tuple((item["name"], int(item["weight"])) for item in strategy["resources"]),
                   "NodeResourcesBalancedAllocation" not in disabled, int(extender.get("weight", 1)),
                   int(profile.get("percentageOfNodesToScore", config.get("percentageOfNodesToScore", 0)) or 0))


def feasible_nodes_to_find(percentage: int, all_nodes: int) -> int:
    """numFeasibleNodesToFind: how many feasible nodes end the filter pass."""
    if all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return all_nodes
    if percentage <= 0:
        percentage = max(50 - all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(all_nodes * min(percentage, 100) // 100, MIN_FEASIBLE_NODES_TO_FIND)


def fit_score(strategy: Strategy, resources: Sequence[tuple[str, int]], pod: Mapping[str, int],
              requested: Mapping[str, int], allocatable: Mapping[str, int]) -> int:
    """NodeResourcesFit's score; `requested` is what the node's pods request before this `pod`."""
    total = weights = 0
    for name, weight in resources:
        if name not in ("cpu", "memory") and not pod.get(name):
            continue
        capacity, used = allocatable.get(name, 0), requested.get(name, 0) + pod.get(name, 0)
        if capacity == 0:
            score = 0
        elif strategy == "LeastAllocated":
            score = 0 if used > capacity else (capacity - used) * MAX_NODE_SCORE // capacity
        else:
            score = min(used, capacity) * MAX_NODE_SCORE // capacity
        total += score * weight
        weights += weight
    return total // weights if weights else 0


def balanced_score(pod: Mapping[str, int], requested: Mapping[str, int], allocatable: Mapping[str, int]) -> int:
    """NodeResourcesBalancedAllocation's score over cpu and memory (a best-effort pod skips it: 0)."""
    if not pod.get("cpu") and not pod.get("memory"):
        return 0
    fractions = [min((requested.get(name, 0) + pod.get(name, 0)) / allocatable[name], 1.0)
                 for name in ("cpu", "memory") if allocatable.get(name)]
    std = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - std) * MAX_NODE_SCORE)


def score_node(profile: Profile, pod: Mapping[str, int], requested: Mapping[str, int],
               allocatable: Mapping[str, int], extender_score: int | None = None) -> int:
    """The node's total as prioritizeNodes sums it; `requested` is the node's before the pod."""
    total = fit_score(profile.strategy, profile.resources, pod, requested, allocatable)
    if profile.balanced:
        total += balanced_score(pod, requested, allocatable)
    if profile.extender_weight is not None and extender_score is not None:
        total += extender_score * profile.extender_weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    return total


def gpu_job_resources(gpus: int) -> dict[str, int]:
    """A node's allocatable, or a pod's request, with cpu and memory in proportion to its GPUs."""
    return {GPU: gpus, "cpu": gpus * CPU_MILLI_PER_GPU, "memory": gpus * MEMORY_MIB_PER_GPU}


@cache
def score_gpu_node(profile: Profile, pod_gpus: int, node_used: int, node_gpus: int,
                   extender_score: int | None = None) -> int:
    """`score_node` for a pod of `pod_gpus` on a node of `node_gpus` GPUs with `node_used` in use (memoised:
    a replay asks it for every node of every pod)."""
    return score_node(profile, gpu_job_resources(pod_gpus), gpu_job_resources(node_used),
                      gpu_job_resources(node_gpus), extender_score)


def select_host(totals: Sequence[tuple[str, int]], rng: random.Random) -> str:
    """selectHost: a node with the highest total, uniformly at random among ties (kube-scheduler's reservoir
    sampling draws the same distribution; one draw here keeps the replay fast)."""
    best = max(score for _, score in totals)
    ties = [name for name, score in totals if score == best]
    return ties[tie_index(len(ties), rng)]


def tie_index(count: int, rng: random.Random) -> int:
    """Which of `count` equal best nodes is taken: drawn from `rng`, nothing drawn for a lone node. The replay's
    kube-scheduler draws by it (`select_host`), and so does the extender's `--one-best` (extender/verbs/filter.py
    `_one`), from the same generator: where one-best takes the draw from kube-scheduler, among the same nodes, both
    meet the same draws and a run places alike with and without it (with a generator of its own, the extender
    would change which tied node each pod gets, and every pod after it)."""
    return rng.randrange(count) if count > 1 else 0
