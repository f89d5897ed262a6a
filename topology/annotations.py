"""Annotation keys (DESIGN §5, §6): the one place their names are written.

The prefix is configurable so that two installations can share a cluster; every key hangs off it.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology import bounds

DEFAULT_PREFIX = "gpu-topology.io"



class _Key:
    """An annotation name that reads as the full key under its owner's prefix."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, keys: AnnotationKeys, owner: type | None = None) -> str:
        return f"{keys.prefix}/{self.name}"


@dataclass(frozen=True, slots=True)
class AnnotationKeys:
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        prefix = self.prefix
        if len(prefix) > 253 or not bounds.DNS_SUBDOMAIN.fullmatch(prefix):
            raise ValueError(f"annotation prefix {prefix!r} is not a DNS subdomain such as {DEFAULT_PREFIX}")

    # On nodes, written by the reporter.
    topology = _Key("topology")
    state = _Key("state")
    # On pods, written by the user.
    interconnect = _Key("interconnect")
    placement = _Key("placement")
    min_bandwidth = _Key("min-bandwidth")
    topology_wait = _Key("topology-wait")  # seconds this pod waits for a full-bandwidth set (extender/verbs/wait.py)
    comm_share = _Key("comm-share")  # share of its step time in all-reduce, 0 to 1 (topology/collectives.py)
    # On pods, written by the user: the job this pod is a member of, placed whole (DESIGN §10, extender/groups/).
    group = _Key("group")  # the group's name, in the pod's namespace
    group_size = _Key("group-size")  # members with GPUs, 1 to MAX_GROUP_SIZE
    group_span = _Key("group-span")  # nvlink-domain, or one of --topology-levels' node-label keys
    group_placement = _Key("group-placement")  # required | preferred (the default)
    group_segment = _Key("group-segment")  # members that must share one NVLink domain, dividing the group's size
    # On pods, written by the extender's admission webhook: each pod claim whose template the planner makes pinned,
    # `<pod claim>=<template>[,...]` (extender/verbs/pinning/admission.py, extender/verbs/pinning/planner.py).
    claim_templates = _Key("claim-templates")
    # On pods, written by the extender at bind (in the Binding, so in the same write that sets the node).
    gpus = _Key("gpus")  # every GPU of the pod, comma-separated
    containers = _Key("containers")  # each container's GPUs (topology/assignment.py); the agent delivers these
    ring_bandwidth = _Key("ring-bandwidth")
    seal = _Key("seal")  # the extender's MAC over the pod's UID, node and assignment (extender/cache/seal.py)
    group_plan = _Key("group-plan")  # the group's plan as it stood at this member's bind, sealed with `seal`
    # On the extender's own Pod, a label (not an annotation): "true" on the leader only, set once its ledger is
    # rebuilt and removed when it steps down; the Service selects it, so kube-scheduler reaches the leader alone.
    leader = _Key("leader")
