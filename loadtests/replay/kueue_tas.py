"""Kueue's Topology Aware Scheduling assignment for one pod set, with its default BestFit profile and a required
level, as kubernetes-sigs/kueue pkg/cache/tas_flavor_snapshot.go `findTopologyAssignment` computes it (read, not
copied):

1. Each node holds as many pods as fit in its free resources (here: free GPUs over GPUs per pod); each block's
   count is the sum of its children's.
2. At the requested level, blocks are sorted by count, most first (ties by their label path); if the first
   cannot hold the pod set, a required request does not fit. Otherwise the block taken is the first of the
   smallest count that still holds it (findBestFitDomainIdx): the best fit.
3. Level by level down to the nodes, the children of the blocks taken are sorted the same way and taken in that
   order until the pods are covered, the last one again chosen by best fit (updateCountsToMinimum).
4. The nodes come out sorted by their label path (buildAssignment).

Kueue counts pods and resources only: which GPUs of a node a pod gets is left to the node's device plugin.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Path = tuple[str, ...]


def assign(paths: Mapping[str, Path], fits: Mapping[str, int], count: int, depth: int) -> list[str] | None:
    """A node for each of `count` pods, in Kueue's order, or None when no block at `depth` holds them now.

    `paths` gives each node's block names from the outermost level down, its own name last; `fits` how many pods
    each node holds now; `depth` the requested level, as the length of its blocks' paths (0: the whole fleet)."""
    state: dict[Path, int] = {}
    children: dict[Path, set[Path]] = {}
    for node, path in paths.items():
        for length in range(len(path) + 1):
            prefix = path[:length]
            state[prefix] = state.get(prefix, 0) + fits.get(node, 0)
            if length:
                children.setdefault(path[:length - 1], set()).add(prefix)
    level = _sorted([prefix for prefix in state if len(prefix) == depth], state)
    if not level or state[level[0]] < count:
        return None
    taken = [(level[_best_fit(level, state, count)], count)]
    for _ in range(depth, max(len(path) for path in paths.values())):
        taken = _cover(_sorted([child for block, _ in taken for child in children.get(block, ())], state), state,
                       count)
    return [path[-1] for path, pods in sorted(taken) for _ in range(pods)]


def _sorted(blocks: Sequence[Path], state: Mapping[Path, int]) -> list[Path]:
    return sorted(blocks, key=lambda block: (-state[block], block))


def _best_fit(blocks: Sequence[Path], state: Mapping[Path, int], count: int) -> int:
    """findBestFitDomainIdx: in blocks sorted most first, the first of the smallest count that still holds
    `count` (0 when none does)."""
    best = 0
    for index, block in enumerate(blocks):
        if state[block] >= count and state[block] != state[blocks[best]]:
            best = index
    return best


def _cover(blocks: Sequence[Path], state: Mapping[Path, int], count: int) -> list[tuple[Path, int]]:
    """updateCountsToMinimum: blocks in order until `count` pods are covered, the last by best fit."""
    taken: list[tuple[Path, int]] = []
    remaining = count
    for index, block in enumerate(blocks):
        if state[block] >= remaining:
            taken.append((blocks[index + _best_fit(blocks[index:], state, remaining)], remaining))
            return taken
        remaining -= state[block]
        taken.append((block, state[block]))
    raise AssertionError(f"the blocks taken hold fewer than {count} pods")
