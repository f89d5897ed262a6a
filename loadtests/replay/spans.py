"""The spans above a replayed node, read from its labels as the extender reads them (DESIGN §10), and what a
group gets across each.

A node's NVLink domain is its `nvidia.com/gpu.clique` value (one per NVL72 rack); a node without one is an NVLink
domain of its own (its NVSwitch board). Its leaf and spine are Topograph's labels; a leaf is named by its path
from the spine down, so two leaves that share a name under two spines stay two. A node without a level's label
is a block of its own at that level.

Policies read `tightest` (the span a group asks for: the narrowest one a domain of which could hold it empty),
the metrics `span_of` (where its members landed) and `allreduce_gbps` (what that costs its all-reduce).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from enum import IntEnum

from loadtests.replay.clusters import installed_gpus
from loadtests.replay.model import LEAF_LABEL, SPINE_LABEL, ClusterNode, Job
from topology.collectives import ALLREDUCE
from topology.fabric import CLIQUE_LABEL


class Span(IntEnum):
    """The narrowest block that holds all of a group's members, innermost first."""

    DOMAIN = 0
    LEAF = 1
    SPINE = 2
    FLEET = 3
    """Across spines, or beyond every labelled block."""


SPAN_NAMES: Mapping[Span, str] = {Span.DOMAIN: "NVLink domain", Span.LEAF: "leaf", Span.SPINE: "spine",
                                  Span.FLEET: "fleet"}


SPINE_FACTOR = 0.5
"""Across leaves a group gets this share of its in-leaf bandwidth: an assumed 2:1 oversubscription of the leaf
uplinks to the spine (a leaf's uplinks carry half of what its nodes can send), as two-tier clusters are often
built; a non-blocking fat tree would be 1.0, and the modelled cost of crossing leaves would vanish."""


def allreduce_gbps(platform: str, span: Span) -> float:
    """The all-reduce bandwidth of a group of `platform` nodes whose members span `span`."""
    bandwidth = ALLREDUCE[platform]
    if span is Span.DOMAIN:
        return bandwidth.domain_gbps
    return bandwidth.leaf_gbps * (1.0 if span is Span.LEAF else SPINE_FACTOR)


class Spans:
    """Each node's block at each span, and how many members of a group each block holds when empty."""

    def __init__(self, nodes: Sequence[ClusterNode]) -> None:
        self.nodes = tuple(nodes)
        self.blocks = {node.name: _blocks(node) for node in nodes}
        self.labelled = {node.name: _labelled(node) for node in nodes}
        self.platform = {node.name: node.platform for node in nodes}
        self._holds: dict[tuple[int, str | None, Span, bool], int] = {}

    def outline(self) -> str:
        """The fleet's shape in words: its NVLink domains of more than one node, leaves and spines."""
        domains = Counter(blocks[Span.DOMAIN] for blocks in self.blocks.values())
        shared = sorted(count for count in domains.values() if count > 1)
        sizes = "/".join(str(size) for size in sorted(set(shared)))
        return (f"{len(shared)} NVLink domains of {sizes} nodes, "
                f"{len({blocks[Span.LEAF] for blocks in self.blocks.values()})} leaves, "
                f"{len({blocks[Span.SPINE] for blocks in self.blocks.values()})} spines")

    def span_of(self, names: Iterable[str]) -> Span:
        """The narrowest span one block of which holds every node named."""
        paths = {self.blocks[name] for name in names}
        return next((span for span in (Span.DOMAIN, Span.LEAF, Span.SPINE)
                     if len({path[span] for path in paths}) <= 1), Span.FLEET)

    def holds(self, job: Job, span: Span, *, labelled: bool = False) -> int:
        """The most members of the job's group (`gpus` each, in its pool) one empty block of the span holds;
        `labelled`: of the blocks a node label names, the only ones the extender sees."""
        key = (job.gpus, job.gpu_model, span, labelled)
        if key not in self._holds:
            per_block: dict[str, int] = {}
            for node in self.nodes:
                if (job.gpu_model in (None, node.gpu_model)
                        and (span is Span.FLEET or not labelled or self.labelled[node.name][span])):
                    block = "" if span is Span.FLEET else self.blocks[node.name][span]
                    per_block[block] = per_block.get(block, 0) + len(installed_gpus(node)) // job.gpus
            self._holds[key] = max(per_block.values(), default=0)
        return self._holds[key]

    def tightest(self, job: Job, *, labelled: bool = False) -> Span:
        """The narrowest span one block of which could hold the whole group empty: what it asks for;
        `labelled`: among the blocks a node label names."""
        return next(span for span in Span
                    if span is Span.FLEET or self.holds(job, span, labelled=labelled) >= job.pods)


def _labelled(node: ClusterNode) -> tuple[bool, bool, bool]:
    """Whether a label names the node's NVLink domain, leaf and spine (indexed by Span)."""
    labels = dict(node.labels)
    return bool(labels.get(CLIQUE_LABEL)), bool(labels.get(LEAF_LABEL)), bool(labels.get(SPINE_LABEL))


def _blocks(node: ClusterNode) -> tuple[str, str, str]:
    """The node's NVLink domain, leaf and spine (indexed by Span); a missing label: a block of its own."""
    labels, own = dict(node.labels), f"node:{node.name}"
    spine, leaf = labels.get(SPINE_LABEL), labels.get(LEAF_LABEL)
    return (labels.get(CLIQUE_LABEL) or own, f"{spine or ''}/{leaf}" if leaf else own, spine or own)
