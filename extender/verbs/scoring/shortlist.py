"""filter's shortlist: where more than K nodes can serve a pod, pass only the K that prioritize ranks best.

kube-scheduler scores only the nodes that pass the extenders' filter, and sends only those to prioritize. At 5,000
nodes, passing every fit made it score thousands of nodes a pod and encode their names twice (issue 32). A node
left out can never cost the pod its placement: kube-scheduler reads the statuses of refused nodes only when no
node passes (schedulePod's FitError, then preemption), and then no shortlist applies. The ones left out are
refused as OUTRANKED, which the answer does not write while a node passes (api/wire.py); filter only counts them
(verbs/filter.py `_best`), and the nodes refused for a reason of their own.

The rank is prioritize's own score, then its packing (fuller nodes first), so kube-scheduler's own packing
(NodeResourcesFit MostAllocated) still chooses among nodes our score ties, from the fullest ones. Names of equal
rank keep kube-scheduler's order.
"""

from __future__ import annotations

from collections import OrderedDict

SHORTLIST = 100
"""K: kube-scheduler's own floor on the nodes it scores in a big cluster (minFeasibleNodesToFind), so it scores no
fewer than it does alone."""

OUTRANKED = "fits, but not among the nodes that give the pod the best placement"

_REMEMBERED = 256  # prioritize follows its filter in the same scheduling cycle: a few pods' lists are enough


class Shortlists:
    """Each recent pod version's shortlist and scores, for its prioritize: scored anew, the K names would be scored
    against the best of K, not of every fit, and could rank otherwise than filter ranked them. Bounded; filter and
    prioritize run one at a time (server/app.py), so it needs no lock."""

    def __init__(self, size: int = _REMEMBERED) -> None:
        self._size = size
        self._lists: OrderedDict[tuple[str, str], tuple[list[str], list[int]]] = OrderedDict()

    def keep(self, pod: tuple[str, str], passed: list[str], scores: list[int]) -> None:
        """The names filter passed, in its order, and their scores (`FilterOutcome.scores`)."""
        if not pod[0]:
            return  # no uid, nothing to know it by
        self._lists[pod] = (passed, scores)
        self._lists.move_to_end(pod)
        while len(self._lists) > self._size:
            self._lists.popitem(last=False)

    def scores(self, pod: tuple[str, str], names: list[str]) -> list[int] | None:
        """The scores filter gave `names`, or None where it shortlisted not all of them for this pod version.
        kube-scheduler sends prioritize the names filter passed, in that order: those are read as one list."""
        kept = self._lists.get(pod)
        if kept is None:
            return None
        passed, scores = kept
        if names == passed:
            return list(scores)
        if len(names) > len(passed):
            return None
        score_of = dict(zip(passed, scores, strict=True))
        found = [score_of.get(name, -1) for name in names]
        return None if -1 in found else found
