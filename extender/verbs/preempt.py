"""preempt: keep a node's victims only where evicting them frees a GPU set the pod can use.

kube-scheduler's dry run counts GPUs; it would evict pods from a node whose freed GPUs are split across
sockets for a pod that requires an NVLink ring. A victim's GPUs are those the ledger holds for it, or those
the node's report says the kubelet gave it. Victims whose GPUs neither knows are taken on trust: the node is
kept and filter judges it after the eviction.
"""

from __future__ import annotations

from collections.abc import Mapping

from extender.api.pod_request import PodRequest
from extender.api.wire import Victims
from extender.cache.cluster_state import ClusterState
from topology.select import Choice, Request, Selector


def preempt_nodes(state: ClusterState, selector: Selector, pod: PodRequest,
                  victims: Mapping[str, Victims]) -> dict[str, Victims]:
    if pod.problem is not None:
        return {}
    if pod.request is None:
        return dict(victims)
    request = pod.request if pod.required else Request(pod.request.count)
    kept = {}
    for node, entry in victims.items():
        view = state.view(node)
        if view is not None and view.sharing.shared:
            if not pod.requires_topology:
                kept[node] = entry  # kube-scheduler's count decides there (topology/sharing.py)
            continue
        if view is None or view.compiled is None:
            continue
        freed = 0
        unknown = False
        for uid in entry.pod_uids:
            held = state.ledger.get(uid)
            record = state.pod(uid)
            if held is not None and held.node == node:
                freed |= view.mask(held.gpus)
            elif record is not None and record.request.key in view.reported_pods:
                freed |= view.mask(view.reported_pods[record.request.key])
            else:
                unknown = True
        if unknown or isinstance(selector.select(view.compiled, (view.free | freed) & ~view.unhealthy, request),
                                 Choice):
            kept[node] = entry
    return kept
