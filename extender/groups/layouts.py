"""Where a whole group goes: one domain, and a full-bandwidth GPU set on a node of it for every member.

kube-scheduler gives extenders no Permit, so a group is planned whole at its first member, as HiveD (the one
extender-based gang scheduler) plans a job's cells at its first pod. The domain is chosen best fit first, as
Kueue's BestFit chooses: the one that leaves the least free capacity over once the group is in it, so partly
used domains fill before empty ones are broken; among equals, a domain already partly used before an empty one.
Inside the domain the fullest nodes are filled first, and a node's sets are taken together, so a 2-GPU-per-pod
group shares nodes and the emptiest nodes stay whole.

Only the node keys (board, free and unhealthy masks) are read, so planning is a function of the cluster as the
ledger sees it, and a node's sets are worked out once per key.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

from extender.cache.node_view import NodeKey, first_fit
from topology.full_sets import full_choice, full_set_masks
from topology.select import Selector, mask_of

_SETS_LIMIT = 1 << 16
_sets: dict[tuple[NodeKey, int], tuple[int, ...]] = {}


@dataclass(frozen=True, slots=True)
class Slot:
    """One member's place: a node and the GPUs (mask) it will get there."""

    node: str
    gpus: int


@dataclass(frozen=True, slots=True)
class Layout:
    """What one domain can give a group now."""

    domain: str
    slots: tuple[Slot, ...]
    leftover: int  # free GPUs of the domain left over once the group is in
    empty: bool  # every healthy GPU of the domain was free: taking it breaks a whole domain


def node_sets(selector: Selector, key: NodeKey, count: int) -> tuple[int, ...]:
    """Disjoint full-bandwidth sets of `count` among the node's free GPUs, best first; remembered per key
    (keys are interned, and few free masks recur), at most 65,536 answers. One GPU has no ring: any free GPU
    is a set of one."""
    found = _sets.get((key, count))
    if found is None and key.order is not None:
        found = _first_fits(selector, key, count)
    if found is None and count == 1:
        found = tuple(1 << gpu for gpu in range(key.compiled.size) if key.free >> gpu & 1)
    if found is None:
        healthy = key.compiled.full_mask & ~key.unhealthy
        sets: list[int] = []
        rest = key.free
        while rest.bit_count() >= count:
            choice = full_choice(selector, key.compiled, rest, healthy, count)
            if choice is None:
                break
            sets.append(mask_of(choice.gpus))
            rest &= ~sets[-1]
        found = tuple(sets)
    if len(_sets) >= _SETS_LIMIT:
        _sets.clear()
    _sets[(key, count)] = found
    return found


def _first_fits(selector: Selector, key: NodeKey, count: int) -> tuple[int, ...]:
    """On a DRA node the allocator gives members placed one after another its successive first fits: the sets
    are those, as long as each is full-bandwidth (NodeKey.deliverable)."""
    assert key.order is not None
    healthy = key.compiled.full_mask & ~key.unhealthy
    sets: list[int] = []
    rest = key.free
    while True:
        chunk = first_fit(rest, key.order, count)
        if chunk.bit_count() < count or (count > 1 and full_choice(selector, key.compiled, chunk, healthy,
                                                                   count) is None):
            return tuple(sets)
        sets.append(chunk)
        rest &= ~chunk


def layout(selector: Selector, domain: str, nodes: Iterable[tuple[str, NodeKey]], members: int, count: int,
           allowed: Container[str] | None = None, segment: int = 1,
           nvlink_of: Callable[[str], str | None] | None = None) -> Layout | None:
    """The group's layout in this domain, the fullest nodes giving their sets first, or None when it has too few
    free full-bandwidth sets on the `allowed` nodes (None: all). What is left over counts every node of the domain.

    With `nvlink_of`, each `segment` members sit inside one NVLink domain (Slurm's `--segment`, Kueue's slices), in
    as few as hold the segments (`fewest_blocks`); a node in none holds no member. After a restart the members still
    to come may end in a short segment."""
    free, empty = 0, True
    offers: dict[str, list[tuple[int, str, tuple[int, ...]]]] = {}
    for name, key in nodes:
        free += key.free.bit_count()
        empty = empty and key.free == key.compiled.full_mask & ~key.unhealthy
        block = "" if nvlink_of is None else nvlink_of(name)
        if block is None or (allowed is not None and name not in allowed):
            continue
        if sets := node_sets(selector, key, count):
            offers.setdefault(block, []).append((key.free.bit_count(), name, sets))
    slots = {block: [Slot(name, gpus) for _, name, sets in sorted(found) for gpus in sets]
             for block, found in offers.items()}
    spread = fewest_blocks({block: len(found) // segment for block, found in slots.items()}, -(-members // segment))
    if spread is None:
        return None
    chosen = [slot for block, taken in spread for slot in slots[block][:taken * segment]]
    return Layout(domain, tuple(chosen[:members]), free - members * count, empty)


def fewest_blocks(capacity: Mapping[str, int], segments: int) -> list[tuple[str, int]] | None:
    """How many segments each block takes, in as few blocks as hold them all: the block left with the fewest spare
    segments among those that hold the rest, else the roomiest, until none is left (Slurm's topology/block does
    the same). None when the blocks together hold too few."""
    spare = {block: held for block, held in capacity.items() if held > 0}
    if sum(spare.values()) < segments:
        return None
    spread: list[tuple[str, int]] = []
    while segments:
        whole = [block for block, held in spare.items() if held >= segments]
        block = (min(whole, key=lambda block: (spare[block] - segments, block)) if whole
                 else max(spare, key=lambda block: (spare[block], block)))
        taken = min(segments, spare.pop(block))
        spread.append((block, taken))
        segments -= taken
    return spread


def best_layout(layouts: Iterable[Layout | None]) -> Layout | None:
    """Best fit: least left over, then a partly used domain before an empty one, then the domain's name."""
    return min((found for found in layouts if found is not None),
               key=lambda found: (found.leftover, found.empty, found.domain), default=None)


def capacity(selector: Selector, nodes: Sequence[tuple[str, NodeKey]], count: int) -> int:
    """Members of `count` GPUs the domain holds with every healthy GPU free: whether the group could ever fit."""
    return sum(len(_healthy_sets(selector, key, count)) for _, key in nodes)


def drain_targets(selector: Selector, nodes: Sequence[tuple[str, NodeKey]], members: int, count: int,
                  frees_at: Mapping[str, float] | None = None) -> tuple[int, list[Slot]]:
    """The `members` full-bandwidth sets of the domain nearest to free, one node's disjoint, and how many of their
    GPUs are free: what to drain so that departures complete the group. Nearest: free now, else on the nodes
    predicted to free soonest (`frees_at`, by node), then with most of their GPUs free now."""
    candidates: list[tuple[float, int, str, int]] = []
    for name, key in nodes:
        ranked = sorted(_healthy_sets(selector, key, count, disjoint=False),
                        key=lambda mask, free=key.free: -(mask & free).bit_count())
        at = 0.0 if frees_at is None else frees_at[name]
        candidates.extend((0.0 if mask & key.free == mask else at, (mask & key.free).bit_count(), name, mask)
                          for mask in _disjoint(ranked))
    candidates.sort(key=lambda candidate: (candidate[0], -candidate[1], candidate[2]))
    chosen = candidates[:members]
    return sum(ready for _, ready, _, _ in chosen), [Slot(name, mask) for _, _, name, mask in chosen]


def _healthy_sets(selector: Selector, key: NodeKey, count: int, disjoint: bool = True) -> list[int]:
    """The full-bandwidth sets of `count` among the node's healthy GPUs (single GPUs for one), disjoint or all."""
    healthy = key.compiled.full_mask & ~key.unhealthy
    if count == 1:
        return [1 << gpu for gpu in range(key.compiled.size) if healthy >> gpu & 1]
    masks = full_set_masks(selector, key.compiled, healthy, count)
    return _disjoint(masks) if disjoint else list(masks)


def _disjoint(masks: Iterable[int]) -> list[int]:
    """Greedily, in the given order, the masks that overlap none taken before."""
    taken, kept = 0, []
    for mask in masks:
        if not mask & taken:
            kept.append(mask)
            taken |= mask
    return kept
