"""prioritize: a 0-10 score per node, a weighted sum of one strategy per module.

Bandwidth dominates: a node that gives the pod a faster ring wins over one that only packs better. Among nodes
that offer the same ring, fragmentation weighs most: breaking the last free NVLink pair, where another candidate
breaks no full set, costs 3 points, which at the shipped extender weight (5, x10) outweighs any NodeResourcesFit
difference (0-100), so MostAllocated cannot pull a 1-GPU pod onto that pair (issue 10). Packing is light, as
kube-scheduler's MostAllocated packs too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from functools import lru_cache, partial
from types import MappingProxyType

from extender.api._names import lookup_few, unique
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import Key, NodeKey
from extender.verbs.answer_memo import ON_LOOP, ShapeMemo
from extender.verbs.drains import Drains, ends_by, keys_seen
from extender.verbs.scoring.bandwidth import bandwidth_score
from extender.verbs.scoring.domains import domain_penalty
from extender.verbs.scoring.fragmentation import fragmentation_score, lost_gpus
from extender.verbs.scoring.grade import SHARED, Grade, grade
from extender.verbs.scoring.offer import Offer
from extender.verbs.scoring.packing import packing_score
from topology.bounds import MAX_GPUS
from topology.select import Choice, Request, Selector, mask_of

MAX_SCORE = 10
WEIGHTS = {"bandwidth": 0.6, "packing": 0.1, "fragmentation": 0.3}


def prioritize_nodes(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str],
                     memo: ShapeMemo[Grade] | None = None, drains: Drains | None = None,
                     compute: bool = True) -> list[int]:
    """A score per name, against the best ring on offer, the most GPUs a choice breaks and whether some candidate's
    domain is not whole among all the names (`grade_scores`). Each name's key is read as its grade (scoring/grade.py,
    remembered per request in `memo`) in C passes (extender/api/_names.c), and each distinct grade is scored once.
    GPUs drained for other pods (extender/verbs/drains.py) are not free to this one. Without `compute`, only
    remembered grades and those quick to work out (memo.ON_LOOP) are used: memo.Unknown if one more is missing."""
    if pod.request is None:
        return [0] * len(names)
    if pod.pinned:  # exactly the pinned GPUs, where they are (filter passed only that node)
        return [MAX_SCORE if (view := state.view(name)) is not None and pod.pinned <= view.index_of.keys() else 0
                for name in names]
    keys = keys_seen(state, names, drains, pod.uid, None, ends_by(pod, state.clock()), pod.request.count)
    grades = (memo or ShapeMemo()).answers(pod.request, keys, partial(score_grade, selector, pod.request),
                                           state.key_epoch, None if compute else ON_LOOP, names)
    return lookup_few(grades, grade_scores(pod.request, unique(grades)))


def score_grade(selector: Selector, request: Request, key: Key | None) -> Grade:
    """What prioritize scores of `key` for `request`."""
    return grade(key, offer_of(selector, request, key) if type(key) is NodeKey else None)


def grade_scores(request: Request, grades: Collection[Grade]) -> dict[Grade, int]:
    """Each grade's score among `grades`, those of all the candidates: scored against the best ring on offer among
    them, the most GPUs a choice breaks, and whether some candidate's domain is not whole."""
    offered = [found for found in grades if found.offered]
    best_ring = max((found.ring_part for found in offered), default=0.0)
    most_lost = max((found.lost_gpus for found in offered), default=0)
    choice = any(found.board and not found.whole for found in grades)
    scores = {found: _score(found, best_ring, most_lost, choice) for found in grades}
    shared = [found for found in grades if found.kind == SHARED]
    if shared and not request.constrained:
        # A pod that asks nothing of topology is not scored down for sharing: level with the best whole-GPU
        # node, so kube-scheduler's own plugins choose among them as they would without us. One that prefers an
        # interconnect keeps 0 there: replicas and MIG slices offer no ring (topology/sharing.py).
        level = max((scores[found] for found in grades if found.board), default=MAX_SCORE)
        scores.update(dict.fromkeys(shared, level))
    return scores


def grade_ranks(request: Request, grades: Collection[Grade]) -> Mapping[Grade, int]:
    """Each grade's `rank` among `grades` (`grade_scores`), for filter's shortlist; read only. Remembered for the
    set of grades, which mostly stays from one request to the next: a few dozen grades scored anew were a tenth of
    filter's time at 5,000 names."""
    return _ranks_among(request, frozenset(grades), rank)


KUBE_PACKING = 100 / (5 * 10)
"""kube-scheduler's packing in our points, as the shipped profile adds the two up
(scheduler-config/kube-scheduler-config.yaml): for a GPU pod whose cpu and memory follow its GPUs, as GPU jobs are
sized and as the replay's kube-scheduler models them (loadtests/replay/kube_scores.py), NodeResourcesFit
MostAllocated gives every resource the share of the node in use once the pod is placed x 100, so their weighted
mean is that share x 100; our score counts x 5 x 10 (the extender's weight 5). Our own score packs lightly
(WEIGHTS), leaving packing to it."""


def one_best_ranks(request: Request, grades: Collection[Grade]) -> Mapping[Grade, int]:
    """Each grade's `kube_rank` among `grades`, for the one node filter passes where kube-scheduler weighs nothing
    else (api/preferences.py); read only, remembered as `grade_ranks`."""
    return _ranks_among(request, frozenset(grades), kube_rank)


def kube_rank(score: int, packing: float) -> int:
    """0 is best: by our score plus kube-scheduler's GPU packing, as the shipped profile adds them (KUBE_PACKING),
    in hundredths of our point."""
    return round(100 * (MAX_SCORE + KUBE_PACKING - score - KUBE_PACKING * packing))


@lru_cache(maxsize=256)
def _ranks_among(request: Request, grades: frozenset[Grade],
                 rank_of: Callable[[int, float], int]) -> Mapping[Grade, int]:
    return MappingProxyType({found: rank_of(score, found.packing)
                             for found, score in grade_scores(request, grades).items()})


PACKING_STEPS = MAX_GPUS + 1  # packing is a share of a board's GPUs, of 64 at most


def rank(score: int, packing: float) -> int:
    """0 is best: by score, then by packing (the fuller node first), as one small number that C can bucket."""
    return (MAX_SCORE - score) * PACKING_STEPS + MAX_GPUS - round(packing * MAX_GPUS)


def best_ranks(names_of: Mapping[int, int], best: int) -> tuple[list[int], list[int]]:
    """The `rank`s of `names_of` (rank -> its names) that the `best` names reach, best first, and how many of the
    best each gives: grouped by their place in that list, the names make a list per rank reached (a few), not one
    per rank number (up to 715)."""
    reached: list[int] = []
    room: list[int] = []
    left = best
    for number in sorted(names_of):
        if left <= 0:
            break
        reached.append(number)
        room.append(min(names_of[number], left))
        left -= room[-1]
    return reached, room


def rank_score(number: int) -> int:
    """The score of a `rank`."""
    return MAX_SCORE - number // PACKING_STEPS


@lru_cache(maxsize=1 << 14)
def _score(found: Grade, best_ring: float, most_lost: int, choice: bool) -> int:
    """Remembered: from one request to the next the grades and the three figures mostly stay (a grade holds no
    board, so none is kept alive)."""
    if not found.offered:
        return 0
    value = (WEIGHTS["bandwidth"] * bandwidth_score(found.ring_gbps, found.meets_preferences, best_ring)
             + WEIGHTS["packing"] * found.packing
             + WEIGHTS["fragmentation"] * fragmentation_score(found.lost_gpus, most_lost))
    return max(0, round(MAX_SCORE * value) - domain_penalty(found.whole, choice))


def offer_of(selector: Selector, request: Request, key: NodeKey) -> Offer | None:
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
