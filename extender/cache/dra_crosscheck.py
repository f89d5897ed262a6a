"""On DRA nodes, the node agent's report against the claims: GPUs the kubelet shows a pod holding that no allocated
ResourceClaim holds.

The two sides come from different places (the kubelet's prepared claims through the agent, kube-apiserver's claims
through the watch), so they disagree for a while around every change, and which way decides what is safe:

- a claim holds a GPU the report does not show: normal while its pod starts (kube-scheduler allocates the claim at
  PreBind, before the kubelet prepares it), and for a claim a pod names but no container uses. The claim keeps the
  GPU taken (the node view's `dra_taken`); nothing is counted;
- the report shows a GPU held that no claim holds: the kubelet still runs a pod on it. The GPU stays taken, since the
  report's `used` counts beside the claims (extender/cache/assignments.py `taken`): freeing it would give a busy GPU
  to another pod. Around a pod's end the two sides drop it a few seconds apart, and the agent keeps the pods of a
  List that emptied at once for 15 s (a kubelet restart looks alike), so a GPU counts as a mismatch only once it has
  been so for GRACE_SECONDS. Then the kubelet and the API server disagree (a claim deleted under a running pod, a
  claim the extender refused or could not keep, a device the agent joined to the wrong GPU): it is logged and
  counted (the `gpu_topology_extender_dra_unclaimed_*` metrics).

Only what it is told: the cluster state calls it under its ledger lock when a DRA node's report or claims change. It
never takes or frees a GPU; the ledger and the node views stay the only owners of that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from extender.cache.node_view import NodeView

log = logging.getLogger(__name__)

# Longer than the agent holds the pods of an emptied List (15 s, topology/agent/reporter.py) plus a report interval (5
# s) and a write: what outlasts it is no race. The agent rewrites its state at least every 30 s, so a lasting mismatch
# is counted within about a minute.
GRACE_SECONDS = 30.0


class ClaimCheck:
    """Per DRA node, the GPUs its report shows held that no claim holds, and since when (the cache's clock)."""

    def __init__(self, clock: Callable[[], float], grace: float = GRACE_SECONDS) -> None:
        self.clock = clock
        self.grace = grace
        self.found = 0  # GPUs that became lasting mismatches, each counted once per spell
        self._since: dict[str, dict[str, float]] = {}
        self._counted: dict[str, frozenset[str]] = {}

    def check(self, view: NodeView, claimed: frozenset[str]) -> None:
        """The node's report (`reported_used`, by pod) against the GPUs its allocated claims hold."""
        now = self.clock()
        previous = self._since.get(view.name, {})
        since = {gpu: previous.get(gpu, now) for gpu in view.reported_used - claimed}
        if not since:
            self.forget(view.name)
            return
        self._since[view.name] = since
        lasting = frozenset(gpu for gpu, at in since.items() if now - at >= self.grace)
        new = lasting - self._counted.get(view.name, frozenset())
        self._counted[view.name] = lasting
        if new:
            self.found += len(new)
            pods = sorted(pod for pod, gpus in view.reported_pods.items() if gpus & new)
            log.warning("node %s: the kubelet has shown %s held (by %s) for %g s or more, and no allocated "
                        "ResourceClaim holds them: they stay taken", view.name, ", ".join(sorted(new)),
                        ", ".join(pods) or "no pod", self.grace)

    def mismatched(self) -> dict[str, frozenset[str]]:
        """Node -> its GPUs the report has shown held, with no claim holding them, for the grace or more."""
        now = self.clock()
        lasting = {node: frozenset(gpu for gpu, at in since.items() if now - at >= self.grace)
                   for node, since in self._since.items()}
        return {node: gpus for node, gpus in lasting.items() if gpus}

    def forget(self, node: str) -> None:
        self._since.pop(node, None)
        self._counted.pop(node, None)
