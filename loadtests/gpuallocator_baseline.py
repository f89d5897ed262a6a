"""NVIDIA go-gpuallocator's best-effort policy, re-implemented in Python as the selection baseline.

Written from the published behaviour of github.com/NVIDIA/go-gpuallocator (gpuallocator/besteffort_policy.go,
gpuallocator/device.go, internal/links/device.go); no code is taken from it. What it does, and what is
mirrored here:

- Pair score: the sum over the links go-gpuallocator records between two GPUs: one PCIe link typed by the
  NVML common ancestor (cross-CPU 10, same CPU 20, host bridge 30, multiple switches 40, single switch 50,
  same board 60) plus, where NVLinks reach the other GPU, N NVLinks = 100 * N. The score switch lists one to
  twelve NVLinks; the link types for 13 to 18 exist but score nothing, and so they do here.
- NVLinks are counted only when an NVLink's remote PCI bus id is the other GPU, so behind an NVSwitch (the
  remote is the switch) it sees no NVLink at all ("TODO: Handle NVSwitch semantics"): with
  `Topology.nvswitch` the baseline scores PCIe only.
- Set score = sum of its pair scores; partition score = sum of its set scores.
- It visits every partition of the available GPUs into sets of `size`, first padding the list with empty
  slots to a multiple of `size`; a set holds either no padding or all of it. Partitions come in a fixed
  order: the first remaining GPU opens the next set, its companions are the (size-1)-combinations of the
  rest in lexicographic order. The best partition is the first with the highest score (strict `>`); the
  answer is the first highest-scoring set inside it (strict `>` again).
- That last step does not skip the padded set: when it outscores every full set, go-gpuallocator returns
  it, nil entries included, and its callers crash on them (NVIDIA/go-gpuallocator PR #80, open). The search
  reports that case as `padded` and returns only the real GPUs of that set.
- Size 1 is a special path: one single-set "partition" per available GPU, all scoring 0, so the first
  available GPU wins. The search counts those n visits as its partitions.
- `required` devices (the kubelet's must-include list) are not modelled: the scheduler never passes any.

`nvidia-smi topo -m` hides the PCIe level of NVLink pairs (it prints NVn), while go-gpuallocator asks NVML
for it. Where our Topology does not know it, the baseline takes SYS across NUMA nodes and NODE within one,
unless the caller supplies the levels (`hidden_pcie`); `DGX1V_HIDDEN_PCIE` holds the levels NVIDIA's own
DGX-1 Volta model gives those pairs.

The search is the same enumeration in the same order with the same tie-breaks; it only scores
incrementally (each set once, summed down the recursion) where go-gpuallocator rescores every partition
from scratch, so this baseline does less work per partition than a literal port.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from functools import cache
from math import comb, factorial

from topology.levels import Level
from topology.model import Topology

# The PCIe part of a pair score, by the level NVML reports (TOPOLOGY_SINGLE is topo -m's PIX, and so on).
PCIE_LINK_SCORE: dict[Level, int] = {
    Level.SYS: 10,   # P2PLinkCrossCPU     (TOPOLOGY_SYSTEM)
    Level.NODE: 20,  # P2PLinkSameCPU      (TOPOLOGY_NODE)
    Level.PHB: 30,   # P2PLinkHostBridge   (TOPOLOGY_HOSTBRIDGE)
    Level.PXB: 40,   # P2PLinkMultiSwitch  (TOPOLOGY_MULTIPLE)
    Level.PIX: 50,   # P2PLinkSingleSwitch (TOPOLOGY_SINGLE)
}
# P2PLinkSameBoard (TOPOLOGY_INTERNAL, two GPUs on one card such as a K80): topo -m has no code for it.
SAME_BOARD_SCORE = 60
NVLINK_SCORE_PER_LINK = 100
MAX_SCORED_NVLINKS = 12

# NVIDIA's DGX-1 Volta test node (go-gpuallocator gpuallocator/common_test.go, NewDGX1VoltaNode): the PCIe
# link type of the pairs that topo -m shows as NV1/NV2. Its NVLink layout is the same as our dgx1-v100.
DGX1V_HIDDEN_PCIE: dict[tuple[int, int], Level] = {
    (0, 1): Level.PIX, (0, 2): Level.PHB, (0, 3): Level.PHB, (0, 4): Level.SYS,
    (1, 2): Level.PHB, (1, 3): Level.PHB, (1, 5): Level.SYS,
    (2, 3): Level.PIX, (2, 6): Level.SYS,
    (3, 7): Level.SYS,
    (4, 5): Level.PIX, (4, 6): Level.PHB, (4, 7): Level.PHB,
    (5, 6): Level.PHB, (5, 7): Level.PHB,
    (6, 7): Level.PIX,
}


def count_partitions(available: int, size: int) -> int:
    """How many partitions go-gpuallocator visits for `available` GPUs and sets of `size`.

    With p = padding, the padded set holds size - p real GPUs and the rest split into full sets:
    C(n, size - p) * (n - size + p)! / (size!^(b - 1) * (b - 1)!), b = (n + p) / size; without padding
    n! / (size!^b * b!). Size 1 takes the shortcut: n single-set partitions.
    """
    if size <= 0 or size > available:
        return 0
    if size == 1:
        return available
    padding = -available % size
    blocks = (available + padding) // size
    if padding == 0:
        return factorial(available) // (factorial(size) ** blocks * factorial(blocks))
    in_padded = size - padding
    rest = available - in_padded
    return comb(available, in_padded) * factorial(rest) // (factorial(size) ** (blocks - 1) * factorial(blocks - 1))


def count_combinations(available: int, size: int) -> int:
    """How many candidate sets go-gpuallocator generates on the way, including those it then drops for
    holding part of the padding (C(29, 14) = 77.6 M of them at the top level for 15 of 16 GPUs)."""
    if size <= 1 or size > available:
        return 0
    padding = -available % size

    @cache
    def below(remaining: int, pads: int) -> int:
        if remaining == size:
            return 0
        generated = comb(remaining - 1, size - 1)
        generated += comb(remaining - 1 - pads, size - 1) * below(remaining - size, pads)
        if pads:
            generated += comb(remaining - 1 - pads, size - 1 - pads) * below(remaining - size, 0)
        return generated

    return below(available + padding, padding)


@dataclass(frozen=True, slots=True)
class Search:
    """The outcome of one best-effort query."""

    gpus: tuple[int, ...] | None  # None when the time budget ran out first
    padded: bool  # the winning set held padding: go-gpuallocator would return nil entries (PR #80)
    partitions: int  # partitions visited
    total: int  # partitions the full search visits (count_partitions)
    combinations: int  # candidate sets generated (count_combinations when complete)
    elapsed_ns: int

    @property
    def complete(self) -> bool:
        return self.gpus is not None

    def estimate_ns(self, available: int, size: int) -> float:
        """The elapsed time, or for an unfinished search the full search's, extrapolated by the work done
        (partitions visited plus candidate sets generated)."""
        if self.complete:
            return float(self.elapsed_ns)
        done = self.partitions + self.combinations
        return self.elapsed_ns * (self.total + count_combinations(available, size)) / max(done, 1)


class _OutOfTime(Exception):
    pass


class BestEffortBaseline:
    """go-gpuallocator's BestEffortPolicy over one node: the pair score table is built once."""

    def __init__(self, topology: Topology, hidden_pcie: Mapping[tuple[int, int], Level] | None = None) -> None:
        n = topology.size
        hidden = dict(hidden_pcie or {})
        for (i, j), level in hidden.items():
            known = topology.pcie[i][j]
            if known is not None and known != level:
                raise ValueError(f"GPU{i}/GPU{j}: the topology says {known.name}, hidden_pcie says {level.name}")
        self.node_size = n
        # Padding slots are the ids n .. 2n-1 and score 0 with everything, like a nil *Device.
        self.scores: tuple[tuple[int, ...], ...] = tuple(
            tuple(pair_score(topology, i, j, hidden) if i != j and i < n and j < n else 0 for j in range(2 * n))
            for i in range(2 * n))

    def set_score(self, gpus: tuple[int, ...]) -> int:
        row = self.scores
        return sum(row[a][b] for x, a in enumerate(gpus) for b in gpus[x + 1:])

    def allocate(self, available: Iterable[int], size: int) -> tuple[int, ...]:
        """The set go-gpuallocator returns; an empty tuple where it returns none. Raises where it returns nil."""
        found = self.search(available, size)
        if found.padded:
            raise PaddingReturned(f"go-gpuallocator returns padding (nil devices) with {found.gpus}")
        assert found.gpus is not None
        return found.gpus

    def search(self, available: Iterable[int], size: int, budget_ns: int | None = None) -> Search:
        """Run the partition search over the available GPUs (in the order given), within an optional budget."""
        devices = tuple(available)
        start = time.perf_counter_ns()
        if len(set(devices)) != len(devices) or not all(0 <= gpu < self.node_size for gpu in devices):
            raise ValueError(f"available GPUs {devices} must be distinct indices 0..{self.node_size - 1}")
        n = len(devices)
        total = count_partitions(n, size)
        if total == 0:
            return Search((), False, 0, 0, 0, time.perf_counter_ns() - start)
        if size == 1:
            # Every single-GPU set scores 0 and the first one found is kept.
            return Search((devices[0],), False, n, n, 0, time.perf_counter_ns() - start)
        best: tuple[tuple[int, ...], ...] = ()
        best_score = 0
        visited = 0
        # Each set is scored once per query; go-gpuallocator rescores it in every partition that holds it.
        known: dict[tuple[int, ...], int] = {}

        def set_score(gpus: tuple[int, ...]) -> int:
            found = known.get(gpus)
            if found is None:
                found = known[gpus] = self.set_score(gpus)
            return found

        def keep(stack: list[tuple[int, ...]], last: tuple[int, ...], score: int) -> None:
            nonlocal best, best_score, visited
            visited += 1
            if not best or score > best_score:
                best, best_score = (*stack, last), score

        deadline = None if budget_ns is None else start + budget_ns
        try:
            generated = _walk_partitions(devices, size, self.node_size, set_score, keep, deadline)
        except _OutOfTime as stop:
            return Search(None, False, visited, total, stop.args[0], time.perf_counter_ns() - start)
        chosen, chosen_score = best[0], set_score(best[0])
        for candidate in best[1:]:
            score = set_score(candidate)
            if score > chosen_score:
                chosen, chosen_score = candidate, score
        real = tuple(gpu for gpu in chosen if gpu < self.node_size)
        return Search(real, len(real) < size, visited, total, generated, time.perf_counter_ns() - start)


class PaddingReturned(RuntimeError):
    """go-gpuallocator would have returned nil devices (a padded set) here."""


def pair_score(topology: Topology, i: int, j: int,
               hidden_pcie: Mapping[tuple[int, int], Level] | None = None) -> int:
    """go-gpuallocator's score for the links between GPU i and GPU j."""
    links = 0 if topology.nvswitch else topology.nvlink_count(i, j)
    nvlink = NVLINK_SCORE_PER_LINK * links if links <= MAX_SCORED_NVLINKS else 0
    return PCIE_LINK_SCORE[pcie_level(topology, i, j, hidden_pcie)] + nvlink


def pcie_level(topology: Topology, i: int, j: int,
               hidden_pcie: Mapping[tuple[int, int], Level] | None = None) -> Level:
    """The PCIe level NVML would report; for NVLink pairs topo -m hides it, so take the caller's or guess."""
    level = topology.pcie[i][j]
    if level is not None:
        return level
    given = (hidden_pcie or {}).get((min(i, j), max(i, j)))
    if given is not None:
        return given
    return Level.NODE if topology.gpus[i].numa_node == topology.gpus[j].numa_node else Level.SYS


def iterate_partitions(available: Iterable[int], size: int) -> list[tuple[tuple[int | None, ...], ...]]:
    """Every partition go-gpuallocator visits, in its order, padding shown as None (for tests)."""
    devices = tuple(available)
    if size <= 0 or size > len(devices):
        return []
    if size == 1:
        return [((gpu,),) for gpu in devices]
    pad_from = max(devices) + 1
    found: list[tuple[tuple[int | None, ...], ...]] = []
    _walk_partitions(devices, size, pad_from, lambda _: 0, lambda stack, last, _: found.append(
        tuple(tuple(gpu if gpu < pad_from else None for gpu in group) for group in (*stack, last))))
    return found


def _walk_partitions(devices: tuple[int, ...], size: int, pad_from: int,
                     set_score: Callable[[tuple[int, ...]], int],
                     visit: Callable[[list[tuple[int, ...]], tuple[int, ...], int], None],
                     deadline_ns: int | None = None) -> int:
    """Call visit(sets so far, last set, partition score) on each partition of `devices`, padded with the
    ids pad_from, pad_from + 1, ... The sets so far are a shared stack: copy it to keep it.

    Returns how many candidate sets it generated; past the deadline it raises _OutOfTime(that count)."""
    padding = -len(devices) % size
    padded = devices + tuple(range(pad_from, pad_from + padding))
    stack: list[tuple[int, ...]] = []
    generated = 0

    def walk(remaining: tuple[int, ...], score: int) -> None:
        nonlocal generated
        if len(remaining) == size:
            visit(stack, remaining, score + set_score(remaining))
            return
        first, rest = remaining[0], remaining[1:]
        for companions in combinations(rest, size - 1):
            generated += 1
            if deadline_ns is not None and not generated & 0xFFF and time.perf_counter_ns() > deadline_ns:
                raise _OutOfTime(generated)
            # Padding sits at the end, so a set holding any has it last; it must hold all of it.
            if padding and companions[-1] >= pad_from and sum(1 for gpu in companions if gpu >= pad_from) != padding:
                continue
            chosen = (first, *companions)
            stack.append(chosen)
            walk(tuple(gpu for gpu in rest if gpu not in companions), score + set_score(chosen))
            stack.pop()

    walk(padded, 0)
    return generated
