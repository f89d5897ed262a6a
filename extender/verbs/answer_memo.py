"""Answers per (request shape, node key), kept across requests.

A node's key changes only when its free or unhealthy GPUs do, and most pods ask for one of a few shapes (count
and constraints), so filter verdicts and prioritize offers repeat from one scheduling cycle to the next.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from extender.api._names import lookup_few
from extender.cache.node_view import NodeKey

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Unknown(Exception):
    """An answer is not remembered, and the caller asked for remembered answers only."""


@dataclass(frozen=True, slots=True)
class Inline:
    """What may still be worked out where only remembered answers were asked for (the event loop,
    extender/server/app.py): the answers for keys that `cheap` accepts, for at most `seconds` in all. Anything more
    raises Unknown."""

    cheap: Callable[[Any], bool]
    seconds: float


# Boards of at most 8 GPUs: a selection there weighs at most 2^8 sets. Measured on the demo platforms' boards
# (every free mask, the load test's eight pod shapes): a new filter verdict takes 0.4 us at the median and at most
# about 0.3 ms, a new prioritize offer 17 us and at most about 0.9 ms. Handing the request to the verbs' thread
# instead costs more than the median answer many times over: the loop's attempt up to the missing answer is done
# again there (0.1 to 0.2 ms at 5,000 names), and the hop there and back. Bigger boards, and answers past the
# 0.5 ms, still go to the thread: one selection there may take the work budget whole.
INLINE_MAX_GPUS = 8
ON_LOOP = Inline(lambda key: not isinstance(key, NodeKey) or key.compiled.size <= INLINE_MAX_GPUS, 0.0005)


_LAST = 64  # (shape, repeated list) pairs whose last answers are kept: a few lists, a few dozen shapes


class ShapeMemo(Generic[V]):
    """One dictionary per request shape, keyed by node key; emptied whole when it holds too much, or when the
    cluster state forgot keys (its `key_epoch` moved on), so that no answer keeps a dead node's board alive. Equal
    answers are kept as one object, so that a C pass can count them by identity (extender/api/_names.c counts)."""

    def __init__(self, max_entries: int = 1 << 18) -> None:
        self._max_entries = max_entries
        self._shapes: dict[Hashable, dict[Hashable, V]] = {}
        self._values: dict[V, V] = {}
        # (shape, id of a name list requests repeat) -> (that list, the keys and answers of its last request)
        self._last: OrderedDict[tuple[Hashable, int], tuple[list[str], list[K], list[V]]] = OrderedDict()
        self._entries = 0
        self._epoch = 0

    def answers(self, shape: Hashable, keys: list[K], compute: Callable[[K], V], epoch: int = 0,
                inline: Inline | None = None, names: list[str] | None = None) -> list[V]:
        """The shape's answer for each of `keys` (a node key per name: a few objects repeated), in one C pass
        (extender/api/_names.c lookup_few) that works out only the answers not yet known; with `inline`, only the
        missing answers it allows, and Unknown for the rest (a new answer may take a selection's whole work
        budget). What was worked out before Unknown is kept. Where `names` is a list that requests repeat
        (api/wire.py RecentNames), the answers of its last request are read again where its key is the same: a
        bind or two changes a few nodes between requests, and 1,600 distinct keys (DRA nodes) cost 0.2 ms to look
        up anew."""
        if self._entries > self._max_entries or epoch != self._epoch:
            self._shapes.clear()
            self._values.clear()
            self._last.clear()
            self._entries = 0
            self._epoch = epoch
        known = self._shapes.setdefault(shape, {})
        deadline = 0.0 if inline is None else time.perf_counter() + inline.seconds

        def make(key: K) -> V:
            if inline is not None and (not inline.cheap(key) or time.perf_counter() > deadline):
                raise Unknown
            value = compute(key)
            self._entries += 1
            return self._values.setdefault(value, value)

        origin = getattr(names, "origin", None)
        if origin is None:
            return lookup_few(keys, known, make)
        last = self._last.get((shape, id(origin)))
        if last is not None and last[0] is origin and len(last[1]) == len(keys):
            found = lookup_few(keys, known, make, last[1], last[2])
        else:
            found = lookup_few(keys, known, make)
        self._last[(shape, id(origin))] = (origin, keys, found)
        self._last.move_to_end((shape, id(origin)))
        while len(self._last) > _LAST:
            self._last.popitem(last=False)
        return found
