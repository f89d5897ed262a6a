"""prioritize: a 0-10 score per node, a weighted sum of one strategy per module.

Bandwidth dominates: a node that gives the pod a faster ring wins over one that only packs better. Among nodes
that offer the same ring, fragmentation weighs most: breaking the last free NVLink pair, where another candidate
breaks no full set, costs 3 points, which at the shipped extender weight (5, x10) outweighs any NodeResourcesFit
difference (0-100), so MostAllocated cannot pull a 1-GPU pod onto that pair (issue 10). Packing is light, as
kube-scheduler's MostAllocated packs too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from extender.api._names import counts, group, lookup_few, unique
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import Key, NodeKey, SharedKey
from extender.verbs.answer_memo import ON_LOOP, ShapeMemo
from extender.verbs.drains import Drains, ends_by, keys_seen
from extender.verbs.scoring.bandwidth import bandwidth_score
from extender.verbs.scoring.book import ScoreBook
from extender.verbs.scoring.offer import Offer
from extender.verbs.scoring.domains import domain_penalty
from extender.verbs.scoring.fragmentation import fragmentation_score, lost_gpus
from extender.verbs.scoring.packing import packing_score
from topology.bounds import MAX_GPUS
from topology.select import Choice, Request, Selector, mask_of

MAX_SCORE = 10
WEIGHTS = {"bandwidth": 0.6, "packing": 0.1, "fragmentation": 0.3}


def prioritize_nodes(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str],
                     memo: ShapeMemo[Offer | None] | None = None, drains: Drains | None = None,
                     compute: bool = True, book: ScoreBook | None = None) -> list[int]:
    """A score per name (see `key_scores`). The passes over the names run in C (extender/api/_names.c). GPUs
    drained for other pods (extender/verbs/drains.py) are not free to this one."""
    if pod.request is None:
        return [0] * len(names)
    if pod.pinned:  # exactly the pinned GPUs, where they are (filter passed only that node)
        return [MAX_SCORE if (view := state.view(name)) is not None and pod.pinned <= view.index_of.keys() else 0
                for name in names]
    keys = keys_seen(state, names, drains, pod.uid, None, ends_by(pod, state.clock()), pod.request.count)
    return lookup_few(keys, key_scores(state, selector, pod.request, set(unique(keys)), memo, compute, book).score_of)


def ranked_names(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str], best: int,
                 memo: ShapeMemo[Offer | None] | None = None, drains: Drains | None = None,
                 compute: bool = True, book: ScoreBook | None = None) -> list[list[str]]:
    """The names in one list per `rank`, best first, each in the order given, as far as the `best` names need
    (`as_far_as`): where filter could not rank them itself (filter_nodes' `rank`)."""
    assert pod.request is not None
    keys = keys_seen(state, names, drains, pod.uid, None, ends_by(pod, state.clock()), pod.request.count)
    ranks = key_scores(state, selector, pod.request, set(unique(keys)), memo, compute, book).rank_of
    # By each name's rank, not its key's: DRA nodes' keys are many (a thousand and more of 2,500 DRA nodes), ranks
    # a few dozen, so the ranks are counted and cut in C passes over the names, not in Python over the keys.
    numbers = lookup_few(keys, ranks)
    cut = as_far_as(counts(numbers), best)
    return group(names, numbers, cut, max(cut.values(), default=0) + 1)


PACKING_STEPS = MAX_GPUS + 1  # packing is a share of a board's GPUs, of 64 at most


def rank(score: int, packing: float) -> int:
    """0 is best: by score, then by packing (the fuller node first), as one small number that C can bucket."""
    return (MAX_SCORE - score) * PACKING_STEPS + MAX_GPUS - round(packing * MAX_GPUS)


def as_far_as(names_of: Mapping[int, int], best: int) -> dict[int, int]:
    """Each `rank` of `names_of` (rank -> its names) as far as the `best` names need it: up to the rank of the
    best-th name as it is, every lower one numbered one past it, so that grouping the names by these numbers
    makes a few lists, not one per rank (715), the last one every name below the best."""
    total, last = 0, -1
    for last in sorted(names_of):
        total += names_of[last]
        if total >= best:
            break
    return {number: min(number, last + 1) for number in names_of}


def rank_score(number: int) -> int:
    """The score of a `rank`."""
    return MAX_SCORE - number // PACKING_STEPS


@dataclass(frozen=True, slots=True)
class KeyScores:
    """Each distinct key's score, and its `rank` (for filter's shortlist)."""

    score_of: Mapping[Key | None, int]
    rank_of: Mapping[Key | None, int]


def key_scores(state: ClusterState, selector: Selector, request: Request, distinct: set[Key | None],
               memo: ShapeMemo[Offer | None] | None = None, compute: bool = True,
               book: ScoreBook | None = None) -> KeyScores:
    """Scores depend only on the node key, so each distinct key of the candidates is scored once; what each node
    key offers the pod is remembered across requests in `memo`, and its score in `book` while the candidates' best
    ring, most GPUs lost and whole domains stay the same. Without `compute`, only remembered offers and those quick
    to work out (memo.ON_LOOP) are used: memo.Unknown if one more is missing."""
    book = book or ScoreBook()
    tally = book.tally(request, state.key_epoch)
    dropped = tally.seen.difference(distinct)
    added = [key for key in distinct.difference(tally.seen) if type(key) is NodeKey]
    known = (memo or ShapeMemo()).answers(request, added, partial(_offer, selector, request),
                                          state.key_epoch, None if compute else ON_LOOP)
    tally.move(distinct, dropped, {key: known[key] for key in added})
    norms = tally.norms()
    page = book.page(request, norms)
    scored = page.scores
    new = [key for key in distinct.difference(scored) if type(key) is NodeKey]
    for key in new:
        offer = tally.offers[key]
        scored[key] = score = _score(key, offer, *norms)
        page.ranks[key] = rank(score, 0.0 if offer is None else offer.packing)
    book.grew(2 * (len(added) + len(new)))
    if len(distinct) == len(tally.offers):
        return KeyScores(scored, page.ranks)
    score_of = {key: scored.get(key, 0) for key in distinct}
    shared = [key for key in distinct if isinstance(key, SharedKey)]
    if shared and not request.constrained:
        # A pod that asks nothing of topology is not scored down for sharing: level with the best whole-GPU
        # node, so kube-scheduler's own plugins choose among them as they would without us. One that prefers an
        # interconnect keeps 0 there: replicas and MIG slices offer no ring (topology/sharing.py).
        level = max((score_of[key] for key in tally.offers), default=MAX_SCORE)
        score_of.update(dict.fromkeys(shared, level))
    ranks = page.ranks
    return KeyScores(score_of, {key: ranks[key] if key in ranks else rank(score_of[key], 0.0) for key in distinct})


def _score(key: NodeKey, offer: Offer | None, best_ring: float, most_lost: int, choice: bool) -> int:
    if offer is None:
        return 0
    value = (WEIGHTS["bandwidth"] * bandwidth_score(offer.choice, offer.meets_preferences, best_ring)
             + WEIGHTS["packing"] * offer.packing
             + WEIGHTS["fragmentation"] * fragmentation_score(offer.lost_gpus, most_lost))
    return max(0, round(MAX_SCORE * value) - domain_penalty(key.whole, choice))


def _offer(selector: Selector, request: Request, key: NodeKey) -> Offer | None:
    """What the node gives: on a DRA node, the set its allocator will pick (NodeKey.deliverable)."""
    given = key.deliverable(request.count)
    if request.constrained:
        constrained = selector.select(key.compiled, given, request)
        if isinstance(constrained, Choice):
            return offered(selector, key, request.count, constrained, True)
    plain = selector.select(key.compiled, given, Request(request.count))
    return offered(selector, key, request.count, plain, not request.constrained) if isinstance(plain, Choice) else None


def offered(selector: Selector, key: NodeKey, count: int, choice: Choice, meets_preferences: bool) -> Offer:
    healthy = key.compiled.full_mask & ~key.unhealthy
    return Offer(choice, meets_preferences, lost_gpus(selector, key.compiled, key.free, healthy, mask_of(choice.gpus)),
                 packing_score(key.compiled, key.free, key.unhealthy, count),
                 (choice.ring_gbps or 0.0) if meets_preferences else 0.0)
