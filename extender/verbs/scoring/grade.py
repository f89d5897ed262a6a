"""A node key's grade for one request shape: what filter and prioritize read of it, without its GPUs.

A DRA node's key carries its slice order (cache/node_view.py), so at 5,000 names with half of them DRA nodes the
keys are about one per DRA node, 1,500 and more. What a verb reads of a key takes far fewer values: the verdict,
and where the node can serve, the ring it gives, the full sets it breaks, its packing and whether its domain is
whole. Each key's grade is remembered per shape (verbs/answer_memo.py), equal grades are one object, and a request
maps its names' keys to grades in one C pass; every decision after that is made per grade. So the Python work of a
request grows with the grades, a few dozen, and not with the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extender.cache.node_view import Key, NodeKey, SharedKey
from extender.verbs.scoring.offer import Offer

BOARD, SHARED, NONE = "board", "shared", "none"
"""A grade's kind: a node scored by what its board offers; one whose GPUs are shared (kube-scheduler's count
decides there); one with no usable topology or state."""


@dataclass(frozen=True, slots=True)
class Grade:
    """`verdict`: filter's (reason, resolvable) where the node fails, else None (prioritize's grades carry none).
    The rest is what prioritize scores: its offer without the chosen GPUs, None where it offers no set."""

    kind: str
    whole: bool = False
    verdict: tuple[str, bool] | None = None
    meets_preferences: bool = False
    ring_gbps: float | None = None
    lost_gpus: int = 0
    packing: float = 0.0
    ring_part: float = 0.0
    offered: bool = False
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A request hashes each grade into several dicts: hashing nine fields each time costs more than the rest.
        object.__setattr__(self, "_hash", hash((self.kind, self.whole, self.verdict, self.meets_preferences,
                                                self.ring_gbps, self.lost_gpus, self.packing, self.ring_part,
                                                self.offered)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def board(self) -> bool:
        return self.kind == BOARD


def grade(key: Key | None, offer: Offer | None, verdict: tuple[str, bool] | None = None) -> Grade:
    """The grade of `key`, which offers `offer` (None: no set, or not a board key)."""
    if type(key) is not NodeKey:
        return Grade(SHARED if isinstance(key, SharedKey) else NONE, verdict=verdict)
    if offer is None:
        return Grade(BOARD, key.whole, verdict)
    return Grade(BOARD, key.whole, verdict, offer.meets_preferences, offer.choice.ring_gbps, offer.lost_gpus,
                 offer.packing, offer.ring_part, True)
