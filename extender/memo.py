"""Answers per (request shape, node key), kept across requests.

A node's key changes only when its free or unhealthy GPUs do, and most pods ask for one of a few shapes (count
and constraints), so filter verdicts and prioritize offers repeat from one scheduling cycle to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Unknown(Exception):
    """An answer is not remembered, and the caller asked for remembered answers only."""


class ShapeMemo(Generic[V]):
    """One dictionary per request shape, keyed by node key; emptied whole when it holds too much, or when the
    cluster state forgot keys (its `key_epoch` moved on), so that no answer keeps a dead node's board alive."""

    def __init__(self, max_entries: int = 1 << 18) -> None:
        self._max_entries = max_entries
        self._shapes: dict[Hashable, dict[Hashable, V]] = {}
        self._entries = 0
        self._epoch = 0

    def answers(self, shape: Hashable, keys: Iterable[K], compute: Callable[[K], V] | None,
                epoch: int = 0) -> dict[Hashable, V]:
        """The shape's answers, with those for `keys` computed where not yet known; with `compute` None, Unknown
        instead (extender/app.py answers on its event loop only from what is remembered: a new answer may take
        a selection's whole work budget)."""
        if self._entries > self._max_entries or epoch != self._epoch:
            self._shapes.clear()
            self._entries = 0
            self._epoch = epoch
        known = self._shapes.setdefault(shape, {})
        missing = [key for key in keys if key not in known]
        if missing and compute is None:
            raise Unknown
        known.update((key, compute(key)) for key in missing)
        self._entries += len(missing)
        return known
