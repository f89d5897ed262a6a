"""The demo's baseline: GPUs placed by count alone, as a cluster without this extender places them.

kube-scheduler takes the node with the most free GPUs by share (NodeResourcesFit LeastAllocated on nvidia.com/gpu;
among equals the first in node order, where kube-scheduler would pick one at random), and NVIDIA's device plugin
then gives the pod the node's first free GPUs. Neither looks at links, NVLink domains or groups.
"""

from __future__ import annotations

from collections.abc import Mapping


class CountOnly:
    """Free GPUs per node, by index; each placement is one pod's, made alone."""

    def __init__(self, sizes: Mapping[str, int]) -> None:
        self._sizes = dict(sizes)
        self.free = {name: set(range(size)) for name, size in sizes.items()}

    def place(self, gpus: int) -> tuple[str, tuple[int, ...]] | None:
        """The node and GPUs a pod of `gpus` gets, or None when no node has that many free."""
        fits = [name for name, free in self.free.items() if len(free) >= gpus]
        if not fits:
            return None
        node = max(fits, key=lambda name: len(self.free[name]) / self._sizes[name])
        chosen = tuple(sorted(self.free[node])[:gpus])
        self.take(node, chosen)
        return node, chosen

    def take(self, node: str, gpus: tuple[int, ...]) -> None:
        """A pod holds these GPUs (placed here, or already running when the comparison starts)."""
        self.free[node] -= set(gpus)

    def release(self, node: str, gpus: tuple[int, ...]) -> None:
        self.free[node] |= set(gpus)
