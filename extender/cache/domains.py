"""Where each node sits above itself: its NVLink domain and its block at each `--topology-levels` key.

The NVLink domain (an NVL72 rack) is the innermost span; the levels (Topograph's spine and leaf, a cloud's
block labels) follow, outermost first as Kueue's Topology levels list them. A node's domain at a level is the
path of its label values from the outermost level down to that one, so two leaves that reuse a name under
different spines stay two leaves. A node whose GPUs reach no other node over NVLink (an HGX or DGX board, no
fabric) is an NVLink domain of its own, as NCCL counts an NVLink clique as one node: a group spanning an NVLink
domain there shares one node. A node whose fabric is in doubt is in no NVLink domain. A node without the label
of a level is in no domain there, and a group that spans that level cannot be placed on it.

The index is kept as nodes change (a watch event at a time), so the planner reads each domain's members
without scanning the cluster. It also keeps which nodes sit in a domain that is still whole (every GPU of every
node free, at the node's innermost span), so that prioritize can keep single pods out of them (extender/verbs/scoring/
domains.py) through their node keys, at no cost per name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from extender.api.group_request import LABEL_KEY, NVLINK_DOMAIN
from topology.bounds import MAX_DOMAIN_LENGTH

_SPAN_NAMES = {NVLINK_DOMAIN: "NVLink domain"}
OWN_DOMAIN = "node/"
"""How the NVLink domain of a node that is its own is named: no clique string (a UUID and a number) starts so."""


def span_name(span: str) -> str:
    """How a reason names a span: "NVLink domain", or the label key's last word ("leaf", "block")."""
    return _SPAN_NAMES.get(span) or span.rsplit("/", 1)[-1]


class DomainIndex:
    """Nodes by domain, per span. Not thread-safe: the cluster state calls it under its ledger lock."""

    def __init__(self, levels: Sequence[str] = (), on_whole: Callable[[str], None] = lambda node: None) -> None:
        """`on_whole` is told of each node whose domain became whole or stopped being whole."""
        if (len(set(levels)) != len(levels) or NVLINK_DOMAIN in levels
                or not all(LABEL_KEY.fullmatch(level) for level in levels)):
            raise ValueError(f"topology levels must be distinct node-label keys, not {list(levels)}")
        self.levels = tuple(levels)
        self.spans = (NVLINK_DOMAIN, *reversed(self.levels))  # innermost first
        self._of: dict[str, dict[str, str]] = {span: {} for span in self.spans}  # span -> node -> domain
        self._members: dict[str, dict[str, set[str]]] = {span: {} for span in self.spans}
        self._busy: set[str] = set()  # nodes with a GPU in use (or unhealthy)
        self._busy_in: dict[str, dict[str, int]] = {span: {} for span in self.spans}  # span -> domain -> busy nodes
        self.whole: set[str] = set()  # nodes whose innermost domain has every GPU free
        self._on_whole = on_whole
        self._own: set[str] = set()  # nodes that are an NVLink domain of their own

    def update(self, node: str, nvlink_domain: str | None, labels: Mapping[str, Any], doubt: bool = False) -> None:
        """`nvlink_domain` the node's multi-node NVLink domain, None for none; `doubt` its fabric is in doubt."""
        busy = node in self._busy
        self.remove(node)
        own = nvlink_domain is None and not doubt
        if own:
            self._own.add(node)
        for span, domain in self._domains(f"{OWN_DOMAIN}{node}" if own else nvlink_domain, labels).items():
            self._of[span][node] = domain
            self._members[span].setdefault(domain, set()).add(node)
        self.set_busy(node, busy)
        self._recheck(node)

    def remove(self, node: str) -> None:
        self.set_busy(node, False)
        self._busy.discard(node)
        self._own.discard(node)
        for span in self.spans:
            domain = self._of[span].pop(node, None)
            if domain is not None:
                members = self._members[span][domain]
                members.discard(node)
                if not members:
                    del self._members[span][domain]
                    self._busy_in[span].pop(domain, None)
        self._mark(node, False)

    def set_busy(self, node: str, busy: bool) -> None:
        """The node has a GPU in use, or has none in use any more: its domains are whole or not."""
        if busy == (node in self._busy):
            return
        if busy:
            self._busy.add(node)
        else:
            self._busy.remove(node)
        step = 1 if busy else -1
        for span in self.spans:
            domain = self._of[span].get(node)
            if domain is not None:
                count = self._busy_in[span].get(domain, 0) + step
                self._busy_in[span][domain] = count
                if count == (1 if busy else 0):
                    for member in self._members[span][domain]:
                        self._recheck(member)

    def _recheck(self, node: str) -> None:
        """Whole or not at the node's innermost multi-node span (a node's own NVLink domain is no rack to keep)."""
        for span in self.spans:
            domain = self._of[span].get(node)
            if domain is not None and not (span == NVLINK_DOMAIN and node in self._own):
                self._mark(node, self._busy_in[span].get(domain, 0) == 0)
                return
        self._mark(node, False)

    def _mark(self, node: str, whole: bool) -> None:
        if whole == (node in self.whole):
            return
        if whole:
            self.whole.add(node)
        else:
            self.whole.discard(node)
        self._on_whole(node)

    def domain_of(self, span: str, node: str) -> str | None:
        return self._of[span].get(node)

    def domains(self, span: str) -> Mapping[str, set[str]]:
        """Each domain of the span with its nodes (live sets: copy before letting go of the lock)."""
        return self._members[span]

    def outward(self, span: str) -> tuple[str, ...]:
        """The span and every wider one, innermost first: where a preferred group may fall back to."""
        return self.spans[self.spans.index(span):]

    def _domains(self, nvlink_domain: str | None, labels: Mapping[str, Any]) -> dict[str, str]:
        found = {NVLINK_DOMAIN: nvlink_domain} if nvlink_domain else {}
        path: list[str] = []
        for level in self.levels:
            value = labels.get(level)
            if not isinstance(value, str) or not 0 < len(value) <= MAX_DOMAIN_LENGTH:
                path.append("")
                continue
            path.append(value)
            found[level] = "/".join(path)
        return found
