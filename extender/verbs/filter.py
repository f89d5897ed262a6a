"""filter: which candidate nodes can serve the pod, and a short, stable reason for the others.

Reasons are shown verbatim by `kubectl describe pod` and counted per distinct string, so they carry no
per-node numbers. A node goes to FailedAndUnresolvableNodes only when preemption cannot help: no usable
topology, or a node that could not serve the pod even with every healthy GPU free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat

from extender.api._names import counts, group
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import Key, NodeKey, SharedKey
from extender.verbs.answer_memo import ON_LOOP, ShapeMemo
from extender.verbs.drains import Drains, ends_by, keys_seen
from extender.verbs.scoring import best_ranks, grade_ranks, offer_of, one_best_ranks, rank_score
from extender.verbs.scoring.grade import SHARED, Grade, grade
from extender.verbs.scoring.shortlist import OUTRANKED
from extender.verbs.wait import WAITING, WaitClock
from topology.compiled import CompiledTopology
from topology.full_sets import best_ring_gbps, full_choice
from topology.levels import Interconnect
from topology.select import Choice, NoFit, NoFitReason, Selector
from topology.sharing import no_guarantee

STALE = "no fresh GPU state from the node reporter"
NO_TOPOLOGY = "no GPU topology reported"
TOO_SMALL = "node has fewer healthy GPUs than the pod requests"
PINNED_ELSEWHERE = "the pod's claims pin GPUs by UUID that this node does not have"
PINNED_TAKEN = "the GPUs the pod's claims pin by UUID are not all free here"
NOT_ENOUGH_FREE = "not enough free GPUs"
BUDGET = "GPU topology too tangled to search within the work budget"

_RING_NAMES: dict[Interconnect, str] = {
    Interconnect.NVLINK: "NVLink",
    Interconnect.PCIE_SWITCH: "PCIe-switch",
    Interconnect.HOST_BRIDGE: "host-bridge",
    Interconnect.NUMA: "single-NUMA",
    Interconnect.ANY: "",
}


# A failing node's (reason, resolvable).
Refusal = tuple[str, bool]


@dataclass(slots=True)
class FilterOutcome:
    """Passing names, and the failing ones grouped by reason (reason -> names): a few groups, written whole.
    `scores`, where more than `rank_above` names passed: only the best `rank_above` of them passed, best first, and
    these are their prioritize scores (scoring.rank_score). The refused names are then not read out of the request,
    as the answer never writes them while a node passes (api/wire.py): `unlisted` counts them by refusal, the
    passing ones left out as OUTRANKED."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, list[str]] = field(default_factory=dict)
    unresolvable: dict[str, list[str]] = field(default_factory=dict)
    scores: list[int] | None = None
    unlisted: dict[Refusal, int] = field(default_factory=dict)

    def reasons(self) -> tuple[dict[str, str], dict[str, str]]:
        """(FailedNodes, FailedAndUnresolvableNodes) as node -> reason, for people and tests."""
        return ({name: reason for reason, names in self.failed.items() for name in names},
                {name: reason for reason, names in self.unresolvable.items() for name in names})


# A failing node's refusal; None for one that passes.
Verdict = Refusal | None


def filter_nodes(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str],
                 memo: ShapeMemo[Grade] | None = None, wait: WaitClock | None = None,
                 drains: Drains | None = None, compute: bool = True, rank_above: int = 0,
                 one_best: Callable[[int], int] | None = None) -> FilterOutcome:
    """One grade per distinct node key (scoring/grade.py: the verdict, and what prioritize would score),
    remembered across requests in `memo`; the names are read as grades in C passes (extender/api/_names.c), and
    everything after is decided per grade. A pod within its topology wait (extender/verbs/wait.py) passes only nodes
    that can give it a full-bandwidth set; GPUs drained for other waiting pods (extender/verbs/drains.py) are not
    free to it. Without `compute`, only remembered grades and those quick to work out (memo.ON_LOOP) are used:
    memo.Unknown if one more is missing. Where more than `rank_above` names pass (0: never), only the best
    `rank_above` by prioritize's rank (scoring.grade_ranks) pass, best first (`_best`); with `one_best`, only one
    node of those kube-scheduler's shipped profile would rank first by our score and its GPU packing
    (scoring.one_best_ranks), drawn at random among them as its selectHost draws (`_one`), unless a node of shared
    GPUs passes: its own plugins choose among those and the nodes level with them (scoring.grade_scores)."""
    if pod.problem is not None:
        if pod.transient:
            return FilterOutcome([], {pod.problem: list(names)}, {})
        return FilterOutcome([], {}, {pod.problem: list(names)})
    if pod.request is None:
        return FilterOutcome(list(names), {}, {})
    if pod.pinned:
        return _pinned(state, pod.pinned, names)
    keys = keys_seen(state, names, drains, pod.uid, STALE, ends_by(pod, state.clock()), pod.request.count)
    waiting = wait is not None and wait.waits(pod, state.clock())
    grades = (memo or ShapeMemo()).answers((pod.request, pod.required, waiting), keys,
                                           partial(_grade, selector, pod, waiting), state.key_epoch,
                                           None if compute else ON_LOOP, names)
    seen = counts(grades)
    if rank_above > 0:
        passing = [found for found in seen if found.verdict is None]
        alone = one_best is not None and all(found.kind != SHARED for found in passing)
        if sum(seen[found] for found in passing) > (1 if alone else rank_above):
            if alone:
                return _one(names, grades, seen, one_best_ranks(pod.request, passing), one_best)
            return _best(names, grades, seen, grade_ranks(pod.request, passing), rank_above)
    # The passing names numbered 0, each failing verdict one number after them, sorted into one list per number in
    # one C pass.
    reasons: dict[Refusal, int] = {}
    number_of: dict[Grade, int] = {}
    for found in seen:
        number_of[found] = 0 if found.verdict is None else reasons.setdefault(found.verdict, 1 + len(reasons))
    groups = group(names, grades, number_of, 1 + len(reasons))
    outcome = FilterOutcome(groups[0], {}, {})
    for (reason, resolvable), number in reasons.items():
        target = outcome.failed if resolvable else outcome.unresolvable
        target.setdefault(reason, []).extend(groups[number])
    return outcome


def _best(names: list[str], grades: list[Grade], seen: Mapping[Grade, int], ranks: Mapping[Grade, int],
          best: int) -> FilterOutcome:
    """The `best` passing names by rank (`_ranked`), and their prioritize scores."""
    reached, ranked, unlisted = _ranked(names, grades, seen, ranks, best)
    scores = [score for number, members in zip(reached, ranked, strict=True)
              for score in repeat(rank_score(number), len(members))]
    return FilterOutcome(list(chain.from_iterable(ranked)), {}, {}, scores, unlisted)


def _ranked(names: list[str], grades: list[Grade], seen: Mapping[Grade, int], ranks: Mapping[Grade, int],
            best: int) -> tuple[list[int], list[list[str]], dict[Refusal, int]]:
    """The ranks the `best` passing names reach (`ranks`, of the passing grades; scoring.best_ranks), best first,
    and those names in one list per rank, in kube-scheduler's order within one: the one C pass reads no other name
    out of `names` (at 5,000 names, the refused ones were 18% of filter's time). The rest are counted by refusal,
    the passing ones left out as OUTRANKED."""
    names_of: dict[int, int] = {}
    unlisted: dict[Refusal, int] = {}
    for found, count in seen.items():
        if found.verdict is None:
            names_of[ranks[found]] = names_of.get(ranks[found], 0) + count
        else:
            unlisted[found.verdict] = unlisted.get(found.verdict, 0) + count
    reached, room = best_ranks(names_of, best)
    place = {number: at for at, number in enumerate(reached)}
    below = len(reached)  # every other name's number: not read
    number_of = {found: place.get(ranks[found], below) if found.verdict is None else below for found in seen}
    ranked = group(names, grades, number_of, below + 1, [*room, 0])[:below]
    unlisted[OUTRANKED, True] = sum(names_of.values()) - best
    return reached, ranked, unlisted


def _one(names: list[str], grades: list[Grade], seen: Mapping[Grade, int], ranks: Mapping[Grade, int],
         draw: Callable[[int], int]) -> FilterOutcome:
    """One name of the best rank, drawn at random: kube-scheduler draws among its equal best totals, and the first
    in its order would send every pod of a shape to the same few nodes (a 1-GPU pod to the first NVLink boards,
    which multi-GPU pods then miss). Only the names up to the one drawn are read. No `scores`: these ranks are not
    prioritize's (scoring.kube_rank), and kube-scheduler sends no prioritize for one node."""
    passing = {found: count for found, count in seen.items() if found.verdict is None}
    top = min(ranks.values())
    _, ranked, unlisted = _ranked(names, grades, seen, ranks, 1 + draw(sum(
        count for found, count in passing.items() if ranks[found] == top)))
    return FilterOutcome(ranked[-1][-1:], {}, {}, None, {**unlisted, (OUTRANKED, True): sum(passing.values()) - 1})


def _pinned(state: ClusterState, pinned: frozenset[str], names: list[str]) -> FilterOutcome:
    """A pod whose DRA claims pin GPUs by UUID gets exactly those, where they are (kube-scheduler's allocator
    honours the pin): the node that has them all free passes. Such pods are few, and kube-scheduler's DRA plugin
    has narrowed their names to that node already, so this looks at each name."""
    outcome = FilterOutcome()
    for name in names:
        view = state.view(name)
        if view is None or not pinned <= view.index_of.keys():
            outcome.unresolvable.setdefault(PINNED_ELSEWHERE, []).append(name)
        elif view.mask(pinned) & ~(view.free | view.dra_pinned):  # its own claim's pin holds them against others
            outcome.failed.setdefault(PINNED_TAKEN, []).append(name)
        else:
            outcome.passed.append(name)
    return outcome


def _grade(selector: Selector, pod: PodRequest, waiting: bool, key: Key | None) -> Grade:
    """The key's verdict, and where it passes, what prioritize would score (for the shortlist's rank)."""
    assert pod.request is not None
    verdict = _verdict(selector, pod, waiting, key)
    passes = verdict is None and type(key) is NodeKey
    return grade(key, offer_of(selector, pod.request, key) if passes else None, verdict)


def _verdict(selector: Selector, pod: PodRequest, waiting: bool, key: Key | None) -> Verdict:
    if key is None:
        return NO_TOPOLOGY, False
    if key == STALE:
        return STALE, True
    if isinstance(key, str):
        return key, False
    if isinstance(key, SharedKey):
        # Placed as kube-scheduler alone would place it, unless the pod requires what shared devices cannot give.
        return (no_guarantee(key.sharing), False) if pod.requires_topology else None
    assert pod.request is not None
    # On a DRA node only the set its allocator will pick counts (NodeKey.deliverable).
    return node_verdict(selector, pod, key.compiled, key.deliverable(pod.request.count), key.unhealthy, waiting)


def node_verdict(selector: Selector, pod: PodRequest, compiled: CompiledTopology, free: int,
                 unhealthy: int, waiting: bool = False) -> Verdict:
    request = pod.request
    assert request is not None
    healthy = compiled.full_mask & ~unhealthy
    if healthy.bit_count() < request.count:
        return TOO_SMALL, False
    if free.bit_count() < request.count:
        return NOT_ENOUGH_FREE, True
    if waiting and best_ring_gbps(selector, compiled, healthy, request.count) is not None and full_choice(
            selector, compiled, free, healthy, request.count) is None:
        return WAITING, True
    if not pod.requires_topology:
        return None
    result = selector.select(compiled, free, request)
    if isinstance(result, Choice):
        return None
    reason = constraint_reason(pod, result)
    emptied = selector.select(compiled, healthy, request)
    return reason, isinstance(emptied, Choice)


def constraint_reason(pod: PodRequest, no_fit: NoFit) -> str:
    request = pod.request
    assert request is not None
    if no_fit.reason is NoFitReason.INTERCONNECT:
        return f"no free {_RING_NAMES[request.interconnect]} ring of {request.count} GPUs"
    if no_fit.reason is NoFitReason.BUDGET:
        return BUDGET
    return f"ring bandwidth below {request.min_ring_gbps:g} GB/s"
