"""What prioritize keeps per request shape across requests: the candidates' tally and their scores.

A score is scored against three figures of all the candidates: the best ring on offer, the most GPUs a choice
breaks, and whether some candidate's domain is not whole. From one scheduling cycle to the next the candidates are
almost the same keys (a bind or a pod's end changes a node or two), so the tally keeps them as counts and is moved
by the keys a request adds and drops, and the scores are kept while those three figures hold. That matters on DRA
nodes: each node's slice order gives keys of its own (with the fill held by first-fit claims, about 1,700 distinct
keys in 5,000 names), and working the figures and scores out anew took 4.6 ms a request in-process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from extender.cache.node_view import Key, NodeKey
from extender.verbs.scoring.offer import Offer

Norms = tuple[float, int, bool]  # (best ring on offer, most GPUs lost, some candidate outside a whole domain)


@dataclass(frozen=True, slots=True)
class Page:
    """Scores of board keys against one set of norms, and their ranks (`rank`), kept together."""

    scores: dict[Key | None, int]
    ranks: dict[Key | None, int]


class Tally:
    """The last request's candidates of one shape: their keys, each board key's offer, and counts of the figures."""

    def __init__(self) -> None:
        self.seen: set[Key | None] = set()
        self.offers: dict[NodeKey, Offer | None] = {}
        self._rings: Counter[float] = Counter()
        self._lost: Counter[int] = Counter()
        self._outside = 0  # board keys not in a whole domain

    def move(self, distinct: set[Key | None], dropped: Iterable[Key | None],
             added: Mapping[NodeKey, Offer | None]) -> None:
        for key in dropped:
            if type(key) is NodeKey:
                self._count(key, self.offers.pop(key), -1)
        for key, offer in added.items():
            self.offers[key] = offer
            self._count(key, offer, 1)
        self.seen = distinct

    def norms(self) -> Norms:
        return (max(self._rings, default=0.0), max(self._lost, default=0), self._outside > 0)

    def _count(self, key: NodeKey, offer: Offer | None, step: int) -> None:
        self._outside += step * (not key.whole)
        if offer is not None:
            for counter, value in ((self._rings, offer.ring_part), (self._lost, offer.lost_gpus)):
                counter[value] += step
                if not counter[value]:
                    del counter[value]


class ScoreBook:
    """Per shape, its Tally and its scores against the tally's norms; emptied whole when it holds too much or the
    cluster state forgot keys (its `key_epoch` moved on), as the offer memo is."""

    def __init__(self, max_entries: int = 1 << 18) -> None:
        self._max_entries = max_entries
        self._tallies: dict[Hashable, Tally] = {}
        self._pages: dict[Hashable, tuple[Norms, Page]] = {}
        self._entries = 0
        self._epoch = 0

    def tally(self, shape: Hashable, epoch: int) -> Tally:
        if self._entries > self._max_entries or epoch != self._epoch:
            self._tallies.clear()
            self._pages.clear()
            self._entries = 0
            self._epoch = epoch
        return self._tallies.setdefault(shape, Tally())

    def page(self, shape: Hashable, norms: Norms) -> Page:
        """The shape's scores and ranks against `norms`: empty when they moved."""
        found = self._pages.get(shape)
        if found is None or found[0] != norms:
            found = self._pages[shape] = (norms, Page({}, {}))
        return found[1]

    def grew(self, count: int) -> None:
        """`count` more entries were stored (offers in a tally, scores in a page): past the bound, all go."""
        self._entries += count
