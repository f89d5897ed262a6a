"""Domains kept whole: a pod that is not planned with a group scores lower on a node whose NVLink domain (or,
for a node in none, its innermost network block) still has every GPU free.

Why: a rack of 18 GB200 trays is whole only while no pod sits in it. Single pods and small groups spread by
kube-scheduler's own spreading and by free-GPU ties break rack after rack, until a group of 18 trays finds no
empty rack though the cluster has 72 GPUs free ("256 idle GPUs unreachable to 29 queued gangs"). This is the
node fragmentation score (fragmentation.py) one level up: partly used domains fill first, as best fit fills
partly used nodes. Only where the pod has a choice: when every candidate sits in a whole domain, nothing moves.
"""

from __future__ import annotations

WHOLE_DOMAIN_POINTS = 3
"""Points off a node in a whole domain: at the shipped extender weight (5, x10) 150 of kube-scheduler's score,
more than NodeResourcesFit's 100, so its spreading cannot pull a single pod into an empty rack."""


def domain_penalty(whole: bool, choice: bool) -> int:
    """Points off a node: `whole` its domain is whole, `choice` some other candidate's is not."""
    return WHOLE_DOMAIN_POINTS if whole and choice else 0
