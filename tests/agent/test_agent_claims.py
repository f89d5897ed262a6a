"""The claims rule (topology/agent/claims.py), case by case on real platforms, as the kubelet would call it.

Pods are made as the API server serves them, with the assignment the extender writes at bind (the split of
`topology/containers.py`, encoded by `topology/assignment.py`); pod-resources `List` is given as the kubelet shows
it: the pod being admitted with its app containers, those already allocated with their devices."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topology.annotations import AnnotationKeys
from topology.assignment import encode_containers
from topology.compiled import bits
from topology.containers import container_needs, split
from topology.platforms import PLATFORMS
from topology.select import Choice, Request, mask_of
from topology.agent.claims import (
    MAX_DELIVERED_PODS,
    Allocation,
    Board,
    Decision,
    Outcome,
    PodOnNode,
    Preferred,
    best_set,
    identify,
    read_pod,
    remember,
)

KEYS = AnnotationKeys()
GPU = "nvidia.com/gpu"
BOARDS = {name: Board(PLATFORMS[name].topology()) for name in ("dgx1-v100", "rtx-a6000-pairs", "dgx-h100")}


def container(name: str, count: int, restart: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "image": "cuda", "resources": {"limits": {GPU: str(count)}}}
    if restart:
        spec["restartPolicy"] = restart
    return spec


def api_pod(name: str, board: Board, gpus: list[str] | None, *, containers: list[dict] | None = None,
            init: list[dict] | None = None, created: str = "2026-01-01T00:00:00Z", phase: str = "Pending",
            annotations: dict[str, str] | None = None, statuses: list[dict] | None = None) -> dict[str, Any]:
    """A pod as the API serves it; with `gpus`, bound by the extender: its set split per container."""
    spec: dict[str, Any] = {"containers": containers or [container("main", len(gpus or ()) or 1)]}
    if init:
        spec["initContainers"] = init
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}", "creationTimestamp": created,
                            "annotations": dict(annotations or {})}
    if gpus is not None:
        needs = container_needs(spec, GPU)
        parts = split(board.selector, board.compiled, mask_of(board.index[g] for g in gpus), needs)
        meta["annotations"][KEYS.containers] = encode_containers(
            [(part.need.name, [board.ids[i] for i in bits(part.gpus)]) for part in parts])
        meta["annotations"][KEYS.gpus] = ",".join(gpus)
    return {"metadata": meta, "spec": spec, "status": {"phase": phase, "containerStatuses": statuses or []}}


def pods_of(board: Board, *objs: dict[str, Any]) -> list[PodOnNode]:
    return [pod for obj in objs if (pod := read_pod(obj, KEYS, GPU, board.ids)) is not None]


def plan_of(pod: PodOnNode, container_name: str) -> tuple[str, ...]:
    assert pod.plan is not None
    return dict(zip((need.name for need in pod.needs), pod.plan, strict=True))[container_name]


def best(board: Board, free: list[str], count: int) -> list[str]:
    choice = board.selector.select(board.compiled, mask_of(board.index[g] for g in free), Request(count))
    assert isinstance(choice, Choice)
    return [board.ids[i] for i in choice.gpus]


def free_after(board: Board, *taken: list[str]) -> list[str]:
    used = {gpu for part in taken for gpu in part}
    return [gpu for gpu in board.ids if gpu not in used]


# -- the pod being admitted is the one in List ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BOARDS))
@pytest.mark.parametrize("admitted", range(4))
def test_of_several_equal_pods_bound_at_once_the_one_in_list_is_asking(name, admitted):
    board = BOARDS[name]
    sets = [list(board.ids[2 * k:2 * k + 2]) for k in range(4)]
    pods = pods_of(board, *(api_pod(f"p{k}", board, sets[k], created=f"2026-01-01T00:00:0{k}Z") for k in range(4)))
    listed = {("team", f"p{admitted}"): {"main": ()}}  # the kubelet shows app containers, unallocated: empty
    decision = identify(Preferred(board.ids, (), 2), pods, listed, {}, board)
    assert decision.outcome is Outcome.PLANNED
    assert decision.pod is pods[admitted] and decision.container == "main" and decision.rivals == 0
    assert set(decision.ids) == set(sets[admitted])


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_pods_admitted_before_are_complete_and_do_not_compete(name):
    board = BOARDS[name]
    first, second = list(board.ids[:2]), list(board.ids[2:4])
    pods = pods_of(board, api_pod("first", board, first), api_pod("second", board, second))
    listed = {("team", "first"): {"main": tuple(first)}, ("team", "second"): {}}  # an empty pod: not shown yet
    decision = identify(Preferred(tuple(free_after(board, first)), (), 2), pods, listed, {}, board)
    assert decision.pod is pods[1] and set(decision.ids) == set(second)


RUNNING = [{"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:09Z"}}}]


def test_an_ended_pod_asks_for_nothing():
    board = BOARDS["dgx-h100"]
    pods = pods_of(board, api_pod("ended", board, list(board.ids[2:4]), phase="Failed"))
    assert pods[0].ended
    decision = identify(Preferred(board.ids, (), 2), pods, {("team", "ended"): {"main": ()}}, {}, board)
    assert decision.outcome is Outcome.FOREIGN


def test_a_started_pod_has_its_init_containers_done_even_when_the_agent_forgot_them():
    board = BOARDS["dgx-h100"]
    staged = api_pod("staged", board, list(board.ids[:2]), init=[container("prep", 2)], statuses=RUNNING)
    only_init = api_pod("only-init", board, list(board.ids[2:4]), init=[container("prep", 2)],
                        containers=[{"name": "main", "image": "cuda"}], statuses=RUNNING)
    waiting = api_pod("waiting", board, list(board.ids[4:6]))
    pods = pods_of(board, staged, only_init, waiting)
    assert pods[0].started and pods[1].started
    listed = {("team", "staged"): {"main": tuple(board.ids[:2])}, ("team", "only-init"): {"main": ()},
              ("team", "waiting"): {"main": ()}}
    decision = identify(Preferred(board.ids[2:], (), 2), pods, listed, {}, board)  # the agent restarted: no record
    assert decision.pod is pods[2] and decision.rivals == 0


def test_a_started_pod_the_kubelet_lost_asks_again_and_gets_the_same_set():
    """After a kubelet restart that lost its checkpoint, a restarting container is allocated anew."""
    board = BOARDS["dgx-h100"]
    pods = pods_of(board, api_pod("running", board, list(board.ids[:2]), statuses=RUNNING))
    delivered = {pods[0].uid: {"main": tuple(board.ids[:2])}}
    decision = identify(Preferred(board.ids, (), 2), pods, {("team", "running"): {"main": ()}}, delivered, board)
    assert decision.pod is pods[0] and decision.outcome is Outcome.PLANNED and decision.ids == board.ids[:2]


# -- containers of one pod -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_a_multi_container_pod_is_asked_for_container_by_container(name):
    board = BOARDS[name]
    gpus = list(board.ids[:4])
    obj = api_pod("multi", board, gpus, containers=[container("loader", 2), container("trainer", 2)])
    pods = pods_of(board, obj, api_pod("other", board, list(board.ids[4:6])))
    multi = pods[0]
    first = identify(Preferred(board.ids, (), 2), pods, {("team", "multi"): {"loader": (), "trainer": ()}}, {}, board)
    assert (first.container, set(first.ids)) == ("loader", set(plan_of(multi, "loader")))
    after = {("team", "multi"): {"loader": first.ids, "trainer": ()}}
    offered = tuple(free_after(board, list(first.ids)))
    second = identify(Preferred(offered, (), 2), pods, after, {}, board)
    assert second.outcome is Outcome.PLANNED
    assert (second.container, set(second.ids)) == ("trainer", set(plan_of(multi, "trainer")))
    assert set(first.ids) | set(second.ids) == set(gpus)


def test_a_container_whose_count_is_not_the_size_is_not_the_one_asking():
    board = BOARDS["dgx-h100"]
    obj = api_pod("mixed", board, list(board.ids[:3]), containers=[container("one", 1), container("two", 2)])
    pods = pods_of(board, obj)
    decision = identify(Preferred(board.ids, (), 2), pods, {("team", "mixed"): {"one": (), "two": ()}}, {}, board)
    assert decision.container == "two" and set(decision.ids) == set(plan_of(pods[0], "two"))


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_init_containers_are_delivered_by_the_agents_record_and_reused_as_must_include(name):
    board = BOARDS[name]
    gpus = list(board.ids[2:5])
    obj = api_pod("staged", board, gpus, init=[container("prep", 2)], containers=[container("train", 3)])
    pods = pods_of(board, obj)
    staged = pods[0]
    listed = {("team", "staged"): {"train": ()}}  # plain init containers are not listed
    prep = identify(Preferred(board.ids, (), 2), pods, listed, {}, board)
    assert (prep.container, set(prep.ids)) == ("prep", set(plan_of(staged, "prep")))
    given_prep = identify(Allocation(prep.ids), pods, listed, {}, board)
    assert given_prep.outcome is Outcome.PLANNED and given_prep.container == "prep"
    delivered = remember({}, given_prep, pods)
    # The kubelet reuses the init pool: it is must_include, and still offered among available.
    offered = tuple(free_after(board, list(prep.ids))) + prep.ids
    train = identify(Preferred(offered, prep.ids, 3), pods, listed, delivered, board)
    assert train.outcome is Outcome.PLANNED and train.container == "train"
    assert set(train.ids) == set(plan_of(staged, "train")) == set(gpus) and set(prep.ids) <= set(train.ids)


def test_must_include_outside_a_pods_gpus_rules_that_pod_out():
    board = BOARDS["dgx1-v100"]
    pods = pods_of(board, api_pod("mine", board, ["GPU0", "GPU1"]))
    listed = {("team", "mine"): {"main": ()}}
    decision = identify(Preferred(board.ids, ("GPU6",), 2), pods, listed, {}, board)
    assert decision.outcome is Outcome.FOREIGN and "GPU6" in decision.ids and len(decision.ids) == 2


def test_a_sidecar_that_drew_the_pool_is_allocated_without_a_preference():
    board = BOARDS["dgx-h100"]
    obj = api_pod("side", board, list(board.ids[:2]), init=[container("prep", 2), container("proxy", 1, "Always")],
                  containers=[container("main", 1)])
    pods = pods_of(board, obj)
    listed: dict = {("team", "side"): {"proxy": (), "main": ()}}
    prep = identify(Preferred(board.ids, (), 2), pods, listed, {}, board)
    delivered = remember({}, identify(Allocation(prep.ids), pods, listed, {}, board), pods)
    # The kubelet draws the sidecar's one GPU from the pool itself, in map order: Allocate only.
    drawn = identify(Allocation((prep.ids[1],)), pods, listed, delivered, board)
    assert drawn.container == "proxy" and drawn.outcome in (Outcome.PLANNED, Outcome.ADJUSTED)
    assert drawn.ids == (prep.ids[1],)


# -- someone else asking ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_a_static_pod_asking_gets_our_best_set_away_from_pending_claims(name):
    board = BOARDS[name]
    pending = best(board, list(board.ids), 4)  # bound, not reached by the kubelet yet
    obj = api_pod("static", board, None, containers=[container("main", 2)])
    obj["metadata"]["annotations"]["kubernetes.io/config.mirror"] = "abc"
    pods = pods_of(board, api_pod("waiting", board, pending), obj)
    listed = {("team", "static"): {"main": ()}}
    decision = identify(Preferred(board.ids, (), 2), pods, listed, {}, board)
    assert decision.outcome is Outcome.FOREIGN and decision.pod is None
    assert set(decision.ids) == set(best(board, free_after(board, pending), 2))
    assert "static" in decision.reason and "no assignment" in decision.reason


def test_a_pod_not_in_the_api_asking_gets_our_best_set():
    board = BOARDS["rtx-a6000-pairs"]
    decision = identify(Preferred(board.ids, (), 2), [], {("kube-system", "static"): {"main": ()}}, {}, board)
    assert decision.outcome is Outcome.FOREIGN and set(decision.ids) == set(best(board, list(board.ids), 2))


def test_the_foreign_set_ignores_reservations_when_too_few_gpus_are_left():
    board = BOARDS["rtx-a6000-pairs"]
    pods = pods_of(board, api_pod("big", board, list(board.ids[:7])))
    decision = identify(Preferred(board.ids, (), 2), pods, {}, {}, board)
    assert len(decision.ids) == 2 and "GPU7" in decision.ids


def forged(board: Board, mutate) -> dict[str, Any]:
    obj = api_pod("forged", board, list(board.ids[:2]))
    mutate(obj["metadata"]["annotations"])
    return obj


FORGERIES = {
    "malformed": lambda a: a.update({KEYS.containers: "{not json"}),
    "wrong size": lambda a: a.update({KEYS.containers: orjson.dumps({"main": ["GPU0"]}).decode(), KEYS.gpus: "GPU0"}),
    "not on this node": lambda a: a.update({KEYS.containers: orjson.dumps({"main": ["GPU0", "GPU-elsewhere"]}).decode(),
                                            KEYS.gpus: "GPU0,GPU-elsewhere"}),
    "other container": lambda a: a.update({KEYS.containers: orjson.dumps({"side": ["GPU0", "GPU1"]}).decode()}),
    "gpus differ": lambda a: a.update({KEYS.gpus: "GPU4,GPU5"}),
    "same gpu twice": lambda a: a.update({KEYS.containers: '{"main":["GPU0","GPU0"]}'}),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_assignment_is_someone_elses_pod(forgery):
    board = BOARDS["dgx1-v100"]
    pods = pods_of(board, forged(board, FORGERIES[forgery]))
    assert pods[0].plan is None and pods[0].problem
    decision = identify(Preferred(board.ids, (), 2), pods, {("team", "forged"): {"main": ()}}, {}, board)
    assert decision.outcome is Outcome.FOREIGN and len(decision.ids) == 2


def test_pods_asking_for_no_gpu_are_left_out():
    board = BOARDS["dgx1-v100"]
    obj = api_pod("web", board, None, containers=[{"name": "web", "image": "nginx"}])
    assert read_pod(obj, KEYS, GPU, board.ids) is None
    assert read_pod({"kind": "not a pod"}, KEYS, GPU, board.ids) is None


# -- plans the kubelet cannot honour ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_a_plan_partly_taken_keeps_what_is_offered_and_completes_it_best(name):
    board = BOARDS[name]
    planned = best(board, list(board.ids), 4)
    pods = pods_of(board, api_pod("late", board, planned))
    gone = planned[-1]
    offered = tuple(gpu for gpu in board.ids if gpu != gone)
    decision = identify(Preferred(offered, (), 4), pods, {("team", "late"): {"main": ()}}, {}, board)
    assert decision.outcome is Outcome.ADJUSTED and gone in decision.reason
    assert set(planned[:-1]) <= set(decision.ids) and gone not in decision.ids and len(decision.ids) == 4


def test_a_size_beyond_what_is_offered_gets_everything_offered():
    board = BOARDS["dgx1-v100"]
    decision = identify(Preferred(("GPU1", "GPU2"), ("GPU1",), 5), [], {}, {}, board)
    assert set(decision.ids) == {"GPU1", "GPU2"}


# -- ties -------------------------------------------------------------------------------------------------------


def two_candidates(board: Board, created: tuple[str, str] = ("2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z")):
    objs = [api_pod(f"c{k}", board, list(board.ids[2 * k:2 * k + 2]), created=created[k]) for k in range(2)]
    return pods_of(board, *objs), {("team", "c0"): {"main": ()}, ("team", "c1"): {"main": ()}}


def test_ties_go_to_the_earliest_created_and_are_counted():
    board = BOARDS["dgx-h100"]
    pods, listed = two_candidates(board, ("2026-01-01T00:00:09Z", "2026-01-01T00:00:02Z"))
    decision = identify(Preferred(board.ids, (), 2), pods, listed, {}, board)
    assert decision.pod is pods[1] and decision.rivals == 1 and "chosen among" in decision.reason


def test_ties_prefer_a_plan_within_what_is_offered():
    board = BOARDS["dgx-h100"]
    pods, listed = two_candidates(board)
    offered = tuple(gpu for gpu in board.ids if gpu != "GPU0")
    decision = identify(Preferred(offered, (), 2), pods, listed, {}, board)
    assert decision.pod is pods[1] and decision.outcome is Outcome.PLANNED


def test_ties_prefer_a_pod_already_delivered_to_and_answer_the_same_set_again():
    board = BOARDS["dgx-h100"]
    pods, listed = two_candidates(board)
    delivered = {pods[1].uid: {"main": ("GPU2", "GPU6")}}  # the kubelet lost what it had, and asks again
    decision = identify(Preferred(board.ids, (), 2), pods, listed, delivered, board)
    assert decision.pod is pods[1] and decision.ids == ("GPU2", "GPU6")


# -- Allocate -------------------------------------------------------------------------------------------------


def test_allocate_of_ids_this_node_lacks_is_refused():
    board = BOARDS["dgx1-v100"]
    pods = pods_of(board, api_pod("p", board, ["GPU0", "GPU1"]))
    for ids in (("GPU0", "GPU9"), (), ("GPU0", "x" * 500), ("GPU0",) * 300):
        decision = identify(Allocation(ids), pods, {("team", "p"): {"main": ()}}, {}, board)
        assert decision.outcome is Outcome.REFUSED and decision.ids == () and decision.reason


def test_allocate_of_other_ids_than_planned_is_delivered_and_told():
    board = BOARDS["dgx1-v100"]
    pods = pods_of(board, api_pod("p", board, ["GPU0", "GPU1"]))
    listed = {("team", "p"): {"main": ()}}
    decision = identify(Allocation(("GPU5", "GPU0")), pods, listed, {}, board)
    assert decision.outcome is Outcome.ADJUSTED and decision.ids == ("GPU0", "GPU5")
    assert decision.pod is pods[0] and decision.planned == ("GPU0", "GPU1")
    assert remember({}, decision, pods) == {"uid-p": {"main": ("GPU0", "GPU5")}}


def test_allocate_for_a_pod_without_assignment_is_delivered():
    board = BOARDS["dgx1-v100"]
    decision = identify(Allocation(("GPU3",)), [], {}, {}, board)
    assert decision.outcome is Outcome.FOREIGN and decision.ids == ("GPU3",)
    assert remember({}, decision, []) == {}


def test_the_record_forgets_pods_gone_from_the_node_and_stays_bounded():
    board = BOARDS["dgx1-v100"]
    pods = pods_of(board, api_pod("p", board, ["GPU0", "GPU1"]))
    decision = identify(Allocation(("GPU0", "GPU1")), pods, {("team", "p"): {"main": ()}}, {}, board)
    record = remember({"uid-gone": {"main": ("GPU7",)}}, decision, pods)
    assert record == {"uid-p": {"main": ("GPU0", "GPU1")}}
    assert remember({"uid-gone": {"main": ("GPU7",)}}, decision, None)["uid-gone"] == {"main": ("GPU7",)}
    many = {f"uid-{k}": {"main": ("GPU0",)} for k in range(MAX_DELIVERED_PODS + 5)}
    bounded = remember(many, decision, None)
    assert len(bounded) == MAX_DELIVERED_PODS and "uid-p" in bounded and "uid-0" not in bounded


# -- blind: what cannot be read ---------------------------------------------------------------------------------


def test_without_the_pods_the_answer_is_our_best_set():
    board = BOARDS["dgx1-v100"]
    decision = identify(Preferred(board.ids, (), 4), None, {}, {}, board)
    assert decision.outcome is Outcome.BLIND and set(decision.ids) == set(best(board, list(board.ids), 4))


def test_without_pod_resources_the_best_set_keeps_away_from_bound_plans():
    board = BOARDS["dgx1-v100"]
    planned = best(board, list(board.ids), 4)
    pods = pods_of(board, api_pod("bound", board, planned))
    decision = identify(Preferred(board.ids, (), 2), pods, None, {}, board)
    assert decision.outcome is Outcome.BLIND and not set(decision.ids) & set(planned)


def test_best_set_contains_must_include_and_extends_it_by_the_best_ring():
    board = BOARDS["rtx-a6000-pairs"]
    # GPU0's bridge partner is GPU1: the best 2-set holding GPU0 is that pair.
    assert set(best_set(board, board.ids, ("GPU0",), 2)) == {"GPU0", "GPU1"}
    assert best_set(board, board.ids, ("GPU0", "GPU3"), 1) == ("GPU0",)
    assert best_set(board, ("GPU2", "weird"), (), 2) == ("GPU2", "weird")


# -- never an exception ----------------------------------------------------------------------------------------

IDS = st.one_of(st.sampled_from(BOARDS["dgx1-v100"].ids), st.text(max_size=70))


@st.composite
def random_pod(draw) -> Any:
    """A pod, half the time shaped like one with random annotations and counts, else any junk."""
    if not draw(st.booleans()):
        return draw(st.one_of(st.none(), st.text(max_size=3), st.dictionaries(st.text(max_size=3), st.none())))
    annotations = draw(st.dictionaries(st.sampled_from([KEYS.containers, KEYS.gpus, "other"]),
                                       st.one_of(st.text(max_size=40), st.builds(
                                           lambda m: orjson.dumps(m).decode(),
                                           st.dictionaries(st.sampled_from(["main", "x", "Bad Name"]),
                                                           st.lists(IDS, max_size=4), max_size=3))),
                                       max_size=3))
    count = draw(st.one_of(st.integers(-2, 9), st.text(max_size=5)))
    return {"metadata": {"name": draw(st.sampled_from(["a", "b"])), "namespace": "team",
                         "uid": draw(st.text(max_size=5)), "annotations": annotations,
                         "creationTimestamp": draw(st.text(max_size=5))},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: count}}}]},
            "status": draw(st.sampled_from([{}, {"phase": "Failed"}, None, "bad", {"containerStatuses": RUNNING}]))}


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_no_input_makes_it_raise(data):
    board = BOARDS["dgx1-v100"]
    objs = data.draw(st.lists(random_pod(), max_size=3))
    pods = None if data.draw(st.booleans()) and not objs else pods_of(board, *objs)
    listed = data.draw(st.one_of(st.none(), st.dictionaries(
        st.tuples(st.just("team"), st.sampled_from(["a", "b"])),
        st.dictionaries(st.sampled_from(["main", "x"]), st.lists(IDS, max_size=3).map(tuple), max_size=2), max_size=2)))
    delivered = data.draw(st.dictionaries(st.text(max_size=5), st.dictionaries(
        st.sampled_from(["main", "x"]), st.lists(IDS, max_size=3).map(tuple), max_size=2), max_size=2))
    if data.draw(st.booleans()):
        request: Preferred | Allocation = Preferred(tuple(data.draw(st.lists(IDS, max_size=12))),
                                                    tuple(data.draw(st.lists(IDS, max_size=3))),
                                                    data.draw(st.integers(-3, 12)))
    else:
        request = Allocation(tuple(data.draw(st.lists(IDS, max_size=9))))
    decision = identify(request, pods, listed, delivered, board)
    assert isinstance(decision, Decision)
    if isinstance(request, Preferred):
        assert decision.outcome is not Outcome.REFUSED
        offered = set(request.available) | set(request.must_include)
        assert set(decision.ids) <= offered and len(decision.ids) == len(set(decision.ids))
        assert len(decision.ids) <= max(request.size, 0)
        clean_must = {gpu for gpu in request.must_include if 0 < len(gpu) <= 64}
        if 0 < request.size and len(clean_must) <= request.size:
            assert clean_must <= set(decision.ids)
    else:
        known = all(gpu in board.index for gpu in request.ids) and request.ids
        assert (decision.outcome is Outcome.REFUSED) == (not known)
    remember(delivered, decision, pods)
