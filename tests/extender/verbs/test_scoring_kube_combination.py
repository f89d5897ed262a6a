"""Our prioritize scores, added to kube-scheduler's plugin scores as kube-scheduler v1.36 adds them: the case of
issue 10's "Why", reproduced with a real kube-scheduler calling the extender.

An RTX A6000 node had only its NVLink pair 6-7 free, a PCIe-only L40S node 5 GPUs free. For a 1-GPU pod
NodeResourcesFit (MostAllocated, as scheduler-config ships it) gave the A6000 node 72 and the L40S node 41, and
the extender 8 to both, so the pod broke the last free pair and the next 2-GPU pod got 15.75 GB/s over PCIe
instead of 56 GB/s over NVLink.
"""

from __future__ import annotations

import pytest
import yaml

from extender.api.pod_request import PodRequest, parse_pod
from extender.cache.cluster_state import ClusterState
from extender.verbs.scoring import MAX_SCORE, prioritize_nodes
from extender.verbs.scoring.fragmentation import lost_gpus
from helpers.reported_nodes import reported_cluster
from helpers.paths import ROOT
from topology.compiled import compile_topology
from topology.platforms import PLATFORMS
from topology.select import Choice, Request, Selector, mask_of

CONFIG = ROOT / "scheduler-config" / "kube-scheduler-config.yaml"
# kube-scheduler's framework.MaxNodeScore / extenderv1.MaxExtenderPriority: an extender's 0-10 is scaled to 0-100.
EXTENDER_SCALE = 100 // 10
# What NodeResourcesFit scores at most: a plugin score is 0-100 and the shipped config keeps its weight 1.
FIT_SWING = 100
# The issue's NodeResourcesFit (MostAllocated) scores for the 1-GPU pod, read off the real kube-scheduler.
FIT_1GPU = {"a6000": 72, "l40s": 41}


def extender_weight() -> int:
    (extender,) = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["extenders"]
    return int(extender["weight"])


def _cluster(used: dict[str, tuple[str, tuple[int, ...]]]) -> ClusterState:
    return reported_cluster(used)


def _pod(state: ClusterState, gpus: int) -> PodRequest:
    return parse_pod({"metadata": {"name": f"p{gpus}", "namespace": "ml", "uid": f"u{gpus}"},
                      "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}},
                     state.keys)


def _combined(fit: dict[str, int], ours: dict[str, int]) -> dict[str, int]:
    """kube-scheduler's total per node: its plugins' weighted scores plus extender score x weight x 10."""
    return {name: fit[name] + ours[name] * extender_weight() * EXTENDER_SCALE for name in fit}


def _scores(state: ClusterState, gpus: int) -> dict[str, int]:
    names = ["a6000", "l40s"]
    return dict(zip(names, prioritize_nodes(state, Selector(), _pod(state, gpus), names), strict=True))


def _choice(state: ClusterState, node: str, gpus: int) -> Choice:
    (key,) = state.keys_for([node])
    choice = Selector().select(key.compiled, key.free, Request(gpus))
    assert isinstance(choice, Choice)
    return choice


ISSUE_CLUSTER = {"a6000": ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5)), "l40s": ("pcie-l40s", (0, 1, 2))}


def test_a_1_gpu_pod_leaves_the_last_nvlink_pair_whole_against_most_allocated() -> None:
    state = _cluster(ISSUE_CLUSTER)
    ours = _scores(state, 1)
    totals = _combined(FIT_1GPU, ours)
    assert totals["l40s"] > totals["a6000"], (ours, totals)
    # Strong enough at the shipped weight: the margin beats any NodeResourcesFit difference, not just 72 - 41.
    assert (ours["l40s"] - ours["a6000"]) * extender_weight() * EXTENDER_SCALE > FIT_SWING, ours


def test_the_next_2_gpu_pod_then_gets_the_nvlink_pair() -> None:
    first = _choice(_cluster(ISSUE_CLUSTER), "l40s", 1)
    state = _cluster({"a6000": ISSUE_CLUSTER["a6000"],
                      "l40s": ("pcie-l40s", ISSUE_CLUSTER["l40s"][1] + first.gpus)})
    ours = _scores(state, 2)
    # Whatever NodeResourcesFit says, within its 0-100.
    assert (ours["a6000"] - ours["l40s"]) * extender_weight() * EXTENDER_SCALE > FIT_SWING, ours
    pair = _choice(state, "a6000", 2)
    assert pair.gpus == (6, 7) and pair.ring_gbps == 56.0
    assert _choice(state, "l40s", 2).ring_gbps == 15.75, "the PCIe pair it would have had"


@pytest.mark.parametrize(("platform", "free", "chosen", "lost"), [
    ("rtx-a6000-pairs", (6, 7), (6,), 2),  # the last free NVLink pair
    ("rtx-a6000-pairs", (5, 6, 7), (5,), 0),  # the lone GPU fills the hole
    ("rtx-a6000-pairs", (4, 5, 6, 7), (4, 5), 4),  # a pair for a 2-GPU pod is its own, but socket 4-7 is broken
    ("pcie-l40s", (3, 4, 5, 6, 7), (3,), 0),  # GPU3 is alone on its socket: socket 4-7 stays whole
    ("pcie-l40s", (3, 4, 5, 6, 7), (4,), 6),  # the only free socket of four, and with it one of two pairs
    ("pcie-l40s", (3, 4), (3,), 0),  # one GPU per socket: no full pair to break
    ("dgx-h100", (0, 1, 2), (0,), 0),  # behind NVSwitch any two GPUs are a full pair: one pair stays
    ("dgx-h100", (0, 1), (0,), 2),
    ("dgx1-v100", (0, 1, 2, 3), (0, 3), 4),  # an NVLink pair of the quad: the quad is gone, 1-2 stay a pair
])
def test_full_sets_lost_on_real_boards(platform: str, free: tuple[int, ...], chosen: tuple[int, ...],
                                       lost: int) -> None:
    compiled = compile_topology(PLATFORMS[platform].topology())
    assert lost_gpus(Selector(), compiled, mask_of(free), compiled.full_mask, mask_of(chosen)) == lost


def test_a_pod_that_takes_the_whole_pair_is_not_charged_for_it() -> None:
    """Using the pair is what it is for: the 2-GPU pod on the A6000's last pair scores the maximum."""
    assert _scores(_cluster(ISSUE_CLUSTER), 2)["a6000"] == MAX_SCORE
