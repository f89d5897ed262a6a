"""Exact best-subset selection (DESIGN §4).

For free GPUs F and a request of k GPUs, the chosen set S maximises, in this order:

1. ring bandwidth: the best ring (Hamiltonian cycle) through S, judged by its slowest hop, over the hops
   the request allows;
2. total pair bandwidth inside S;
3. NUMA locality: fewer NUMA nodes spanned;
4. least fragmentation: the smallest *cut*, the bandwidth between S and the GPUs left free (F minus S).
   Whatever S does not cut stays among the free GPUs, so a small cut keeps the best sets whole for later
   pods. On a board of NVLink pairs a second 1-GPU pod cuts only PCIe next to the first one, but cuts an
   NVLink pair anywhere else, so it goes next to the first and the other pairs stay whole;
5. lowest GPU indices, for determinism.

How it stays exact and fast: the ring bandwidth of any set is one of the node's pair bandwidths, so the
search walks those thresholds from the highest down. At a threshold t only GPUs with two neighbours at >= t
(one, for k = 2) can be in a ring, and a ring lies inside one connected component; the first threshold
where some k-subset of a component has a Hamiltonian cycle gives the optimal ring bandwidth. Within it a
branch and bound over subsets in index order maximises keys 2-5, with bounds that are exact on uniform
(NVSwitch) boards, so a 16-GPU DGX-2 query visits a few hundred nodes instead of partitions. Every answer is
memoised per (fingerprint, free mask, k, constraint). Tests compare it with brute force on every bundled
platform.

Bounded work: the problem is NP-hard in general, and a board within the bounds can be shaped so that the
search above takes hours (no ring of odd length in a bipartite NVLink graph, say). So each query has a work
budget counted in steps (topology/budget.py), which real boards never reach. A query that runs out answers
safely, never better than it can prove, and marks the choice `exact=False`:
- a ring found before the budget ran out: it has the best ring bandwidth (every faster threshold was
  searched to the end), only keys 2-5 may be beaten by a set not reached;
- else a greedy set, when every pair of it meets the request: its slowest pair is reported as the ring
  bandwidth, a lower bound of its true ring, so a hostile board is never scored above what it can prove;
- else NoFit with reason `budget`: a constrained pod is not placed on a board that cannot be searched.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from itertools import combinations, islice
from dataclasses import dataclass, replace
from enum import Enum
from threading import Lock
from typing import Any, TypeVar

from topology.budget import WORK_BUDGET, BudgetExhausted, WorkBudget
from topology.compiled import CompiledTopology, bits
from topology.levels import Interconnect, Level

T = TypeVar("T")


class NoFitReason(str, Enum):
    TOO_FEW_GPUS = "too-few-gpus"
    INTERCONNECT = "interconnect"
    BANDWIDTH = "bandwidth"
    BUDGET = "budget"


@dataclass(frozen=True, slots=True)
class Request:
    count: int
    interconnect: Interconnect = Interconnect.ANY
    min_ring_gbps: float = 0.0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"a request needs at least 1 GPU, not {self.count}")
        if not math.isfinite(self.min_ring_gbps) or self.min_ring_gbps < 0:
            raise ValueError(f"minimum ring bandwidth must be a finite number >= 0, not {self.min_ring_gbps}")

    @property
    def constrained(self) -> bool:
        return self.interconnect is not Interconnect.ANY or self.min_ring_gbps > 0


@dataclass(frozen=True, slots=True)
class Choice:
    gpus: tuple[int, ...]
    ring_gbps: float | None  # None for a single GPU: there is no ring
    total_gbps: float
    numa_nodes: int
    cut_gbps: float
    weakest: Level | None  # the level of the ring's slowest hop
    exact: bool = True  # False: the work budget ran out first (see the module's docstring for what holds then)

    def as_dict(self) -> dict[str, object]:
        return {"gpus": list(self.gpus), "ring_bandwidth": self.ring_gbps, "total_bandwidth": self.total_gbps,
                "numa_nodes": self.numa_nodes}


@dataclass(frozen=True, slots=True)
class NoFit:
    reason: NoFitReason
    message: str


@dataclass(frozen=True, slots=True)
class _Query:
    compiled: CompiledTopology
    free: int
    count: int
    min_level: Level
    min_mbps: int


class Selector:
    """Answers selection queries and remembers the answers; one per process is enough."""

    def __init__(self, maxsize: int = 1 << 17, budget: int = WORK_BUDGET) -> None:
        self._maxsize = maxsize
        self.budget = budget
        self._memo: OrderedDict[tuple[str, int, int, Level, int], Choice | NoFit] = OrderedDict()
        self._derived: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = Lock()

    def select(self, compiled: CompiledTopology, free: int | Iterable[int], request: Request) -> Choice | NoFit:
        free_mask = free if isinstance(free, int) else mask_of(free)
        if free_mask >> compiled.size:
            raise ValueError(f"free GPUs {bits(free_mask)} name GPUs beyond the node's {compiled.size}")
        min_mbps = math.ceil(request.min_ring_gbps * 1000) if request.count > 1 else 0
        min_level = request.interconnect.min_level if request.count > 1 else Level.SYS
        key = (compiled.fingerprint, free_mask, request.count, min_level, min_mbps)
        with self._lock:
            found = self._memo.get(key)
            if found is not None:
                self._memo.move_to_end(key)
                return found
        result = self._answer(_Query(compiled, free_mask, request.count, min_level, min_mbps), request)
        with self._lock:
            self._memo[key] = result
            if len(self._memo) > self._maxsize:
                self._memo.popitem(last=False)
        return result

    def remembered(self, key: Hashable, work: Callable[[], T]) -> T:
        """An answer worked out from selections (the full sets a mask holds, topology/full_sets.py), remembered
        beside them under the same bound. `key` names the board by its fingerprint, so that no board is kept alive."""
        with self._lock:
            if key in self._derived:
                self._derived.move_to_end(key)
                return self._derived[key]  # type: ignore[no-any-return]
        found = work()
        with self._lock:
            self._derived[key] = found
            if len(self._derived) > self._maxsize:
                self._derived.popitem(last=False)
        return found

    def precompute(self, compiled: CompiledTopology) -> int:
        """Answer every (free mask, k) of a node without constraints; returns how many answers that is."""
        answered = 0
        for free in range(1, compiled.full_mask + 1):
            for count in range(1, free.bit_count() + 1):
                self.select(compiled, free, Request(count))
                answered += 1
        return answered

    def cache_clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self._derived.clear()

    def __len__(self) -> int:
        return len(self._memo)

    def _answer(self, query: _Query, request: Request) -> Choice | NoFit:
        free_count = query.free.bit_count()
        if query.count > free_count:
            return NoFit(NoFitReason.TOO_FEW_GPUS, f"needs {query.count} GPUs, {free_count} free")
        try:
            found = _best(query, WorkBudget(self.budget))
        except BudgetExhausted:
            return _without_search(query)
        return found if found is not None else self._explain(query, request)

    def _explain(self, query: _Query, request: Request) -> NoFit:
        """Why a constrained request found nothing: the best unconstrained ring, and the largest ring of the
        required kind. An unconstrained query of k free GPUs always finds a ring, so this never recurses."""
        unconstrained = self.select(query.compiled, query.free, Request(query.count))
        assert isinstance(unconstrained, Choice), "k free GPUs always form some ring (pair bandwidths are > 0)"
        best = (f"best ring with {query.count} free GPUs is {_gbps_text(unconstrained.ring_gbps)} GB/s "
                f"over {_level_text(unconstrained.weakest)}")
        parts = [best]
        reason = NoFitReason.BANDWIDTH
        largest = _largest_ring(query, self.budget) if request.interconnect is not Interconnect.ANY else query.count
        if largest != query.count:  # a ring of the kind exists when it only misses the bandwidth
            free = "how many are free is past the work budget" if largest is None else f"{largest} free"
            parts.append(f"{request.interconnect.value} needs {query.count} GPUs on "
                         f"{_RING_OF[request.interconnect]}, {free}")
            reason = NoFitReason.INTERCONNECT
        if request.min_ring_gbps > 0:
            parts.append(f"the pod needs at least {_gbps_text(request.min_ring_gbps)} GB/s")
        return NoFit(reason, "; ".join(parts))


def _largest_ring(query: _Query, budget: int) -> int | None:
    """The most free GPUs, up to the query's count, on one ring at the query's level, with one budget for every
    size tried; None when it runs out first."""
    steps = WorkBudget(budget)
    try:
        for count in range(query.count, 1, -1):
            if _best(replace(query, count=count, min_mbps=0), steps) is not None:
                return count
    except BudgetExhausted:
        return None
    return 1 if query.free else 0


def _without_search(query: _Query) -> Choice | NoFit:
    """The answer of a query that ran out of steps before it found any ring (see the module's docstring)."""
    greedy = _greedy(query.compiled, query.free, query.count)
    gpus = greedy.gpus
    levels, mbps = query.compiled.levels, query.compiled.mbps
    if all(levels[i][j] >= query.min_level and mbps[i][j] >= query.min_mbps for i in gpus for j in gpus if i < j):
        return greedy
    return NoFit(NoFitReason.BUDGET, "this board is too tangled to search for such a ring within the work budget")


def _greedy(compiled: CompiledTopology, free: int, k: int) -> Choice:
    """k >= 2 free GPUs picked one at a time, each the one whose slowest pair to those picked is fastest (then the
    most bandwidth to them, then the lowest index): O(k x n) steps. Any order of them is a ring, so its
    slowest pair is a ring bandwidth it can prove."""
    mbps, levels = compiled.mbps, compiled.levels
    members = bits(free)
    first = max(members, key=lambda i: (max((mbps[i][j] for j in members if j != i), default=0), -i))
    chosen = [first]
    slowest = {j: mbps[first][j] for j in members if j != first}
    total_to = dict(slowest)
    while len(chosen) < k:
        gpu = max(slowest, key=lambda j: (slowest[j], total_to[j], -j))
        chosen.append(gpu)
        del slowest[gpu], total_to[gpu]
        for j in slowest:
            slowest[j] = min(slowest[j], mbps[gpu][j])
            total_to[j] += mbps[gpu][j]
    gpus = tuple(sorted(chosen))
    pairs = [(mbps[i][j], i, j) for i in gpus for j in gpus if i < j]
    total = sum(value for value, _, _ in pairs)
    cut = sum(mbps[i][j] for i in gpus for j in members if j not in gpus)
    numa = 0
    for gpu in gpus:
        numa |= compiled.numa_bits[gpu]
    ring, i, j = min(pairs)
    return Choice(gpus, ring / 1000, total / 1000, numa.bit_count(), cut / 1000, levels[i][j], exact=False)


def mask_of(gpus: Iterable[int]) -> int:
    mask = 0
    for gpu in gpus:
        if gpu < 0:
            raise ValueError(f"GPU index {gpu} is negative")
        mask |= 1 << gpu
    return mask


_EXTENSIONS_TRIED = 2048  # sets compared when the answer must contain given GPUs


def extend_best(selector: Selector, compiled: CompiledTopology, must: int, pool: int, extra: int) -> int:
    """The `extra` GPUs of `pool` that make the best ring, then the most pair bandwidth, with all of `must`.

    The kubelet asks for such sets: a container's devices drawn from its pod's init pool, then the rest.
    Small cases are compared whole, within one work budget; past a few thousand candidate sets, or past the
    budget, the best set of `pool` alone.
    """
    members = bits(must)
    candidates = bits(pool & ~must)
    if members and math.comb(len(candidates), extra) <= _EXTENSIONS_TRIED:
        mbps = compiled.mbps
        budget = WorkBudget(selector.budget)

        def score(added: tuple[int, ...]) -> tuple[int, int]:
            chosen = members + list(added)
            return _ring_mbps(compiled, chosen, budget), sum(mbps[i][j] for i in chosen for j in chosen if i < j)

        try:
            return mask_of(max(islice(combinations(candidates, extra), _EXTENSIONS_TRIED), key=score))
        except BudgetExhausted:
            pass
    choice = selector.select(compiled, mask_of(candidates), Request(extra))
    return mask_of(choice.gpus) if isinstance(choice, Choice) else mask_of(candidates[:extra])


def ring_gbps(compiled: CompiledTopology, gpus: Iterable[int]) -> float | None:
    """The best ring bandwidth of any given set over any hops; None for a single GPU. Past the work budget,
    the slowest pair of the set: a ring it surely has."""
    members = sorted(set(gpus))
    if len(members) < 2:
        return None
    try:
        return _ring_mbps(compiled, members, WorkBudget()) / 1000
    except BudgetExhausted:
        return min(compiled.mbps[i][j] for i in members for j in members if i < j) / 1000


def _ring_mbps(compiled: CompiledTopology, members: list[int], budget: WorkBudget) -> int:
    """The best ring bandwidth of two or more GPUs over any hops, in MB/s."""
    mask = mask_of(members)
    values = sorted({compiled.mbps[i][j] for i in members for j in members if i < j}, reverse=True)
    for threshold in values:
        if compiled.has_ring(Level.SYS, threshold, mask, budget):
            return threshold
    raise AssertionError("the slowest pair always closes a ring")


def _best(query: _Query, budget: WorkBudget) -> Choice | None:
    """The best set, None when no set meets the request; BudgetExhausted when the steps run out first."""
    compiled, free, k = query.compiled, query.free, query.count
    if k > free.bit_count():
        return None
    mbps = compiled.mbps
    members = bits(free)
    budget.spend(len(members))
    degree = {i: sum(mbps[i][j] for j in members) for i in members}
    if k == 1:
        gpu = min(members, key=lambda i: (degree[i], i))
        return Choice((gpu,), None, 0.0, 1, degree[gpu] / 1000, None)
    thresholds = sorted({mbps[i][j] for i in members for j in members
                         if i < j and compiled.levels[i][j] >= query.min_level and mbps[i][j] >= query.min_mbps},
                        reverse=True)
    for threshold in thresholds:
        budget.spend(len(members))
        adjacency = compiled.neighbours(query.min_level, threshold)
        found = _best_at(compiled, free, k, adjacency, degree, query.min_level, threshold, budget)
        if found is not None:
            return found
    return None


def _best_at(compiled: CompiledTopology, free: int, k: int, adjacency: tuple[int, ...], degree: dict[int, int],
             min_level: Level, threshold: int, budget: WorkBudget) -> Choice | None:
    """The best k-subset of the free GPUs whose ring runs at >= threshold, or None if no subset does.

    Subsets are visited in ascending index order, so on a full tie the first one found has the lowest
    indices and a bound that merely ties the best can be cut off. One step per search node and per GPU in
    its pool; when the budget runs out, the best set found so far (exact=False), or BudgetExhausted.
    """
    mbps, numa_bits = compiled.mbps, compiled.numa_bits
    components = [c for c in _components(_prune(free, adjacency, 2 if k >= 3 else 1), adjacency)
                  if c.bit_count() >= k]
    if not components:
        return None
    best: list[tuple[int, ...]] = []
    best_key = [(-1, 0, 0)]  # (total, -NUMA span, -cut): larger is better

    def search(pool: list[int], chosen: list[int], total: int, numa: int, chosen_degree: int,
               gain: dict[int, int], pair_max: int) -> None:
        need = k - len(chosen)
        budget.spend(1 + len(pool))
        if need == 0:
            key = (total, -numa.bit_count(), 2 * total - chosen_degree)
            if key > best_key[0] and compiled.has_ring(min_level, threshold, mask_of(chosen), budget):
                best_key[0] = key
                best[:] = [tuple(chosen)]
            return
        if len(pool) < need:
            return
        total_bound = total + sum(sorted((gain[j] for j in pool), reverse=True)[:need]) \
            + need * (need - 1) // 2 * pair_max
        cut_bound = chosen_degree + sum(sorted(degree[j] for j in pool)[:need]) - 2 * total_bound
        if (total_bound, -numa.bit_count(), -cut_bound) <= best_key[0]:
            return
        for position in range(len(pool) - need + 1):
            gpu = pool[position]
            rest = pool[position + 1:]
            chosen.append(gpu)
            search(rest, chosen, total + gain[gpu], numa | numa_bits[gpu], chosen_degree + degree[gpu],
                   {j: gain[j] + mbps[gpu][j] for j in rest}, pair_max)
            chosen.pop()

    exact = True
    try:
        for first in bits(sum(components)):
            component = next(c for c in components if c >> first & 1)
            pool = [j for j in bits(component) if j > first]
            if len(pool) < k - 1:
                continue
            members = [first, *pool]
            budget.spend(len(members))
            pair_max = max(mbps[i][j] for i in members for j in members if i < j)
            search(pool, [first], 0, numa_bits[first], degree[first], {j: mbps[first][j] for j in pool}, pair_max)
    except BudgetExhausted:
        if not best:
            raise
        exact = False
    if not best:
        return None
    gpus = best[0]
    total, negative_span, negative_cut = best_key[0]
    # A ring at exactly this threshold runs at least one hop at it.
    weakest = min(compiled.levels[i][j] for i in gpus for j in gpus if i < j and mbps[i][j] == threshold)
    return Choice(gpus, threshold / 1000, total / 1000, -negative_span, -negative_cut / 1000, weakest, exact)


def _prune(free: int, adjacency: tuple[int, ...], need: int) -> int:
    """Drop GPUs with fewer than `need` usable neighbours until none is left to drop."""
    alive = free
    changed = True
    while changed:
        changed = False
        for gpu in bits(alive):
            if (adjacency[gpu] & alive).bit_count() < need:
                alive &= ~(1 << gpu)
                changed = True
    return alive


def _components(alive: int, adjacency: tuple[int, ...]) -> list[int]:
    found = []
    while alive:
        seed = alive & -alive
        component = seed
        frontier = seed
        while frontier:
            low = frontier & -frontier
            frontier ^= low
            reach = adjacency[low.bit_length() - 1] & alive & ~component
            component |= reach
            frontier |= reach
        found.append(component)
        alive &= ~component
    return found


_RING_OF: dict[Interconnect, str] = {
    Interconnect.NVLINK: "an NVLink ring",
    Interconnect.PCIE_SWITCH: "a ring inside PCIe switches",
    Interconnect.HOST_BRIDGE: "a ring under one host bridge",
    Interconnect.NUMA: "a ring inside one NUMA node",
}


def _gbps_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _level_text(level: Level | None) -> str:
    return "no hop" if level is None else level.name.replace("NVLINK", "NVLink")
