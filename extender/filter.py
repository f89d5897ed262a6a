"""filter: which candidate nodes can serve the pod, and a short, stable reason for the others.

Reasons are shown verbatim by `kubectl describe pod` and counted per distinct string, so they carry no
per-node numbers. A node goes to FailedAndUnresolvableNodes only when preemption cannot help: no usable
topology, or a node that could not serve the pod even with every healthy GPU free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from extender.pod_request import PodRequest
from extender.state import ClusterState, NodeView
from topology.levels import Interconnect
from topology.select import Choice, NoFit, NoFitReason, Selector

STALE = "GPU state is stale"
TOO_SMALL = "node has fewer healthy GPUs than the pod requests"
NOT_ENOUGH_FREE = "not enough free GPUs"

_RING_NAMES: dict[Interconnect, str] = {
    Interconnect.NVLINK: "NVLink",
    Interconnect.PCIE_SWITCH: "PCIe-switch",
    Interconnect.HOST_BRIDGE: "host-bridge",
    Interconnect.NUMA: "single-NUMA",
    Interconnect.ANY: "",
}


@dataclass(slots=True)
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


# (reason, resolvable) for a node that fails; None for one that passes.
Verdict = tuple[str, bool] | None


def filter_nodes(state: ClusterState, selector: Selector, pod: PodRequest, names: Sequence[str]) -> FilterOutcome:
    outcome = FilterOutcome()
    if pod.problem is not None:
        outcome.unresolvable = dict.fromkeys(names, pod.problem)
        return outcome
    if pod.request is None:
        outcome.passed = list(names)
        return outcome
    now = state.clock()
    verdicts: dict[tuple[str, int, int], Verdict] = {}
    for name in names:
        view = state.view(name)
        if view is None:
            outcome.unresolvable[name] = "no GPU topology reported"
            continue
        if view.compiled is None:
            outcome.unresolvable[name] = view.problem or "no GPU topology reported"
            continue
        if state.is_stale(view, now):
            outcome.failed[name] = STALE
            continue
        key = (view.compiled.fingerprint, view.free, view.unhealthy)
        if key in verdicts:
            verdict = verdicts[key]
        else:
            verdict = verdicts[key] = node_verdict(selector, pod, view)
        if verdict is None:
            outcome.passed.append(name)
        elif verdict[1]:
            outcome.failed[name] = verdict[0]
        else:
            outcome.unresolvable[name] = verdict[0]
    return outcome


def node_verdict(selector: Selector, pod: PodRequest, view: NodeView) -> Verdict:
    request = pod.request
    assert request is not None and view.compiled is not None
    healthy = view.compiled.full_mask & ~view.unhealthy
    if healthy.bit_count() < request.count:
        return TOO_SMALL, False
    if view.free.bit_count() < request.count:
        return NOT_ENOUGH_FREE, True
    if not (pod.required and request.constrained):
        return None
    result = selector.select(view.compiled, view.free, request)
    if isinstance(result, Choice):
        return None
    reason = constraint_reason(pod, result)
    emptied = selector.select(view.compiled, healthy, request)
    return reason, isinstance(emptied, Choice)


def constraint_reason(pod: PodRequest, no_fit: NoFit) -> str:
    request = pod.request
    assert request is not None
    if no_fit.reason is NoFitReason.INTERCONNECT:
        return f"no free {_RING_NAMES[request.interconnect]} ring of {request.count} GPUs"
    return f"ring bandwidth below {request.min_ring_gbps:g} GB/s"
