"""The topology wait (extender/verbs/wait.py): a multi-GPU pod that states nothing holds out, for a bounded time from
the first filter call, for a node that can give it a full-bandwidth set; on real boards, through the filter."""

from __future__ import annotations

import pytest

from extender.api.pod_request import PodRequest, parse_pod
from extender.cache.cluster_state import ClusterState
from extender.cli import main
from extender.verbs.filter import NOT_ENOUGH_FREE, filter_nodes
from extender.verbs.wait import WAITING, WaitClock
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.select import Selector

WAIT = 300.0


Clock = ManualClock


def _cluster(clock: Clock, used: dict[str, tuple[str, tuple[int, ...]]],
             unhealthy: dict[str, tuple[int, ...]] | None = None) -> ClusterState:
    return reported_cluster(used, clock=clock, stale_after=100 * WAIT, unhealthy=unhealthy)  # a live reporter


def _pod(state: ClusterState, gpus: int, uid: str = "u1", annotations: dict[str, str] | None = None) -> PodRequest:
    return parse_pod({"metadata": {"name": "train", "namespace": "ml", "uid": uid, "annotations": annotations or {}},
                      "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}},
                     state.keys)


# RTX A6000 board: NVLink pairs 0-1, 2-3, 4-5, 6-7; GPUs 0-3 on one socket, 4-7 on the other.
SCATTERED = ("rtx-a6000-pairs", (1, 2, 3, 5, 6, 7))  # free 0 and 4: no NVLink pair, across sockets
PAIR_FREE = ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5))  # free 6-7: an NVLink pair


def test_a_pod_waits_for_the_node_with_a_full_set_and_passes_only_that_one() -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED, "pair": PAIR_FREE})
    outcome = filter_nodes(state, Selector(), _pod(state, 2), ["scattered", "pair"], wait=WaitClock(WAIT))
    assert outcome.passed == ["pair"]
    assert outcome.failed == {WAITING: ["scattered"]}  # resolvable: a departure or preemption can help


def test_after_the_wait_the_pod_takes_the_best_set_on_offer() -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    wait = WaitClock(WAIT)
    pod = _pod(state, 2)
    assert filter_nodes(state, Selector(), pod, ["scattered"], wait=wait).passed == []
    clock.now += WAIT - 1
    assert filter_nodes(state, Selector(), pod, ["scattered"], wait=wait).passed == []
    clock.now += 1
    assert filter_nodes(state, Selector(), pod, ["scattered"], wait=wait).passed == ["scattered"]


def test_the_wait_counts_from_the_first_filter_call_not_from_creation() -> None:
    """kube-scheduler calls the extender only once some node fits by count: a pod that queued for GPUs
    before that still gets its whole wait for a good set."""
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    wait = WaitClock(WAIT)
    clock.now += 10 * WAIT  # the pod was created long ago; this is its first filter call
    assert filter_nodes(state, Selector(), _pod(state, 2), ["scattered"], wait=wait).passed == []


@pytest.mark.parametrize(("gpus", "annotations"), [
    (1, {}),  # one GPU has no ring to wait for
    (2, {"gpu-topology.io/placement": "required", "gpu-topology.io/interconnect": "any"}),  # its own rule
    (2, {"gpu-topology.io/min-bandwidth": "5"}),  # a stated minimum (met: 0-4 give 9.45) is its own wait
])
def test_pods_that_do_not_wait(gpus: int, annotations: dict[str, str]) -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    pod = _pod(state, gpus, annotations=annotations)
    assert filter_nodes(state, Selector(), pod, ["scattered"], wait=WaitClock(WAIT)).passed == ["scattered"]


def test_no_uid_no_wait_and_zero_turns_it_off() -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    assert filter_nodes(state, Selector(), _pod(state, 2, uid=""), ["scattered"], wait=WaitClock(WAIT)).passed
    assert filter_nodes(state, Selector(), _pod(state, 2), ["scattered"], wait=WaitClock(0)).passed


def test_a_node_short_of_gpus_keeps_its_own_reason() -> None:
    clock = Clock()
    state = _cluster(clock, {"full": ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5, 6))})
    outcome = filter_nodes(state, Selector(), _pod(state, 2), ["full"], wait=WaitClock(WAIT))
    assert outcome.failed == {NOT_ENOUGH_FREE: ["full"]}


def test_a_board_with_a_sick_gpu_is_judged_against_its_healthy_best() -> None:
    """With GPU7 unhealthy the A6000's pair 6-7 is gone for good: the best pair left is 4-5, so a node
    offering 4-5 is full-bandwidth, not a node to wait out."""
    clock = Clock()
    state = _cluster(clock, {"sick": ("rtx-a6000-pairs", (0, 1, 2, 3))}, unhealthy={"sick": (7,)})
    assert filter_nodes(state, Selector(), _pod(state, 2), ["sick"], wait=WaitClock(WAIT)).passed == ["sick"]


def test_the_clock_is_bounded_and_forgets_bound_pods() -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    wait = WaitClock(WAIT, limit=2)
    for uid in ("a", "b", "c"):
        assert wait.waits(_pod(state, 2, uid=uid), clock.now)
    assert len(wait) == 2  # "a", the oldest, was forgotten
    wait.forget("b")
    assert len(wait) == 1


@pytest.mark.parametrize("seconds", [-1.0, MAX_TOPOLOGY_WAIT_SECONDS + 1, float("nan")])
def test_out_of_range_waits_are_refused(seconds: float, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="topology wait"):
        WaitClock(seconds)
    assert main(["serve", "--demo", "--topology-wait", str(seconds)]) == 2
    assert "--topology-wait must be 0 to 86400 seconds" in capsys.readouterr().err


def test_a_pod_states_its_own_wait() -> None:
    clock = Clock()
    state = _cluster(clock, {"scattered": SCATTERED})
    wait = WaitClock(WAIT)
    patient = _pod(state, 2, uid="patient", annotations={"gpu-topology.io/topology-wait": "900"})
    hurried = _pod(state, 2, uid="hurried", annotations={"gpu-topology.io/topology-wait": "0"})
    assert filter_nodes(state, Selector(), hurried, ["scattered"], wait=wait).passed == ["scattered"]
    assert filter_nodes(state, Selector(), patient, ["scattered"], wait=wait).passed == []
    clock.now += WAIT
    assert filter_nodes(state, Selector(), patient, ["scattered"], wait=wait).passed == []
    clock.now += 900 - WAIT
    assert filter_nodes(state, Selector(), patient, ["scattered"], wait=wait).passed == ["scattered"]


@pytest.mark.parametrize("value", ["-1", "1e3", "300s", "86401", "9" * 40, ""])
def test_a_malformed_wait_annotation_is_refused_with_its_name(value: str) -> None:
    state = _cluster(Clock(), {"scattered": SCATTERED})
    pod = _pod(state, 2, annotations={"gpu-topology.io/topology-wait": value})
    assert pod.problem is not None and pod.problem.startswith("gpu-topology.io/topology-wait: ")
    outcome = filter_nodes(state, Selector(), pod, ["scattered"], wait=WaitClock(WAIT))
    assert outcome.unresolvable == {pod.problem: ["scattered"]}
