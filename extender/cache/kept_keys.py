"""The node keys of name lists that requests repeat, kept in each list's order as the keys change.

kube-scheduler sends the same names pod after pod where the nodes that pass its own filters stay the same
(api/wire.py NameLists finds them again by their bytes). Reading 5,000 names' keys from a table was the largest
part of filter left once its decisions were made per grade: 0.14 ms in-process, about twice that in the server,
where a table of 5,000 entries is out of the cache by the time the next request comes. Here a list is looked up
once per request size, and each change of a node's key is written at the node's place in each kept list, a few
dict reads per watch event; a request copies its list, 5,000 pointers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from extender.cache.node_view import Key

KEPT = 16
"""(list, request size) pairs kept: NameLists keeps 4 lists, pods ask a few sizes."""

HELD_BACK = -1
"""The size under which the keys a pod sees beside drains are kept (ClusterState.keys_held_back)."""

KEEP_FROM = 500
"""Shorter lists are looked up each time: their lookup costs little, and kube-scheduler's samples of a big cluster
(adaptive percentageOfNodesToScore) rarely repeat."""


@dataclass(slots=True)
class _Kept:
    names: list[str]  # the kept list itself (NameLists'), which no request changes
    positions: dict[str, int] | None  # None: the list names a node twice, so its keys are looked up each time
    keys: list[Key | None]


class KeptKeys:
    """Changed under `lock` (the ledger's): `read` where it keeps a list, `changed` and `clear` always. A kept
    list is read without it, as one copy."""

    def __init__(self, lock: AbstractContextManager[object]) -> None:
        self._lock = lock
        self._kept: OrderedDict[tuple[int, int], _Kept] = OrderedDict()

    def read(self, names: list[str], size: int, look: Callable[[list[str]], list[Key | None]]) -> list[Key | None]:
        """The keys of `names` (a kept list) for requests of `size`: a copy of those kept, else `look(names)`, kept
        where the list is long enough."""
        found = self._kept.get((id(names), size))
        if found is not None and found.names is names:
            return list(found.keys) if found.positions is not None else look(names)
        if len(names) < KEEP_FROM:
            return look(names)
        with self._lock:  # no change between the lookup and the keeping
            keys = look(names)
            positions = next((kept.positions for kept in self._kept.values() if kept.names is names), None)
            if positions is None:
                positions = {name: at for at, name in enumerate(names)}
            whole = len(positions) == len(names)
            self._kept[(id(names), size)] = _Kept(names, positions if whole else None, list(keys) if whole else [])
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
        return keys

    def changed(self, name: str, key_of: Callable[[int], Key | None]) -> None:
        """The node's key changed: `key_of(size)` is its key as requests of that size read it."""
        for (_, size), kept in self._kept.items():
            at = None if kept.positions is None else kept.positions.get(name)
            if at is not None:
                kept.keys[at] = key_of(size)

    def clear(self) -> None:
        self._kept.clear()
