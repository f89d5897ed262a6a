"""The values every part of the replay shares: a workload is a sequence of Jobs sorted by submit_s, a cluster
a sequence of ClusterNodes. Clusters, workloads, the engine and the policies agree on these and nothing else.

A multi-node job is a group: its member pods are consecutive Jobs of the workload with the same `group`, arrival
and duration. It runs once its last member is placed (a gang rendezvous) and its members leave together."""

from __future__ import annotations

from dataclasses import dataclass

SPINE_LABEL = "network.topology.nvidia.com/spine"
LEAF_LABEL = "network.topology.nvidia.com/leaf"
TOPOLOGY_LEVELS = (SPINE_LABEL, LEAF_LABEL)
"""Topograph's network labels, outermost first: the extender's --topology-levels for a labelled fleet."""


@dataclass(frozen=True, slots=True)
class Job:
    """One pod of a workload."""

    name: str
    submit_s: float
    """Arrival, seconds from the start."""
    duration_s: float
    """Run time once placed (a member: once its group's last member is placed); inf never leaves (FGD's
    inflation mode)."""
    gpus: int
    """Whole GPUs requested; a fractional trace pod counts as 1."""
    gpu_model: str | None = None
    """A node selector on the node's GPU model (its pool); None: any node."""
    fractional: bool = False
    """The trace asked for a share of one GPU, so the output can say how many such pods were counted as 1."""
    group: str | None = None
    """The multi-node job this pod is a member of; None: a pod on its own."""
    pods: int = 1
    """The members of its group, this one included (`gpus` each); 1 for a pod on its own."""
    segment_pods: int | None = None
    """Members of its group that must share one NVLink domain, as declared (a CSV's `segment_pods`, Slurm's
    `--segment`); None: none declared, the whole group is one segment."""
    time_limit_s: float | None = None
    """The time limit its user stated (a CSV's `time_limit_s`), which only the Slurm-like policy reads; None: none
    stated."""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node of a replayed cluster."""

    name: str
    platform: str
    """A key of topology.platforms.PLATFORMS."""
    gpu_model: str
    """The pool label pods select on."""
    installed: tuple[int, ...] | None = None
    """The board GPUs this node has, when it has fewer than the platform's capture (a 2x T4 node of the Alibaba
    fleet is GPUs 0-1 of an 8-GPU PCIe board): the others are absent, never free and not capacity. None: all."""
    labels: tuple[tuple[str, str], ...] = ()
    """Node labels as (key, value) pairs: where the node sits in the fabric (fabric.py reads them, and the
    extender reads them from the Node)."""
