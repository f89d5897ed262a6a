"""One hostile node cannot stall, skew or break scheduling for the others (issue 9, "Why" 1-5).

Work is bounded by counting steps (ring tests, search budget), never by timing: the machine is shared.
"""

from __future__ import annotations

import copy
import gc
import weakref
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topology.compiled as compiled_module
import topology.select as select_module
from extender.api.pod_request import parse_pod
from extender.cache.cluster_state import MAX_DEAD_BOARDS, ClusterState
from extender.groups.plans import GroupPlans
from extender.verbs.answer_memo import ShapeMemo
from extender.verbs.filter import BUDGET, filter_nodes
from extender.verbs.metrics import Metrics
from extender.verbs.scoring import prioritize_nodes
from helpers.hostile_boards import bipartite, bridge_pairs, mesh, ties
from topology.budget import WORK_BUDGET, WorkBudget
from topology.codec import NodeState, encode_state, encode_topology
from topology.compiled import CompiledTopology, compile_topology
from topology.levels import Interconnect, Level
from topology.model import Gpu, NvLinkPair, Topology
from topology.platforms import PLATFORMS
from topology.select import Choice, NoFit, NoFitReason, Request, Selector

NOW = datetime(2026, 11, 21, 19, 0, tzinfo=timezone.utc)
# Per select call: its own search, and for a constrained miss the explanation's two (DESIGN §4, select.py).
STEPS_PER_SELECT = 3 * WORK_BUDGET


class _CountedRings:
    """Counts ring tests (CompiledTopology.has_ring): each costs the search at least one step, on any build,
    and it raises once a query has run far past any budget, so that an unbounded search fails fast."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
        self.calls = 0
        original = CompiledTopology.has_ring

        def counted(compiled: CompiledTopology, *args: object) -> bool:
            self.calls += 1
            if self.calls > limit:
                raise AssertionError(f"more than {limit} ring tests: the search is unbounded")
            return original(compiled, *args)

        monkeypatch.setattr(CompiledTopology, "has_ring", counted)


class _Steps(WorkBudget):
    """A budget that remembers, across one select call, the most steps any of its queries spent."""

    spent: list[int] = []

    def __init__(self, steps: int = WORK_BUDGET) -> None:
        super().__init__(steps)
        self.start = steps
        _Steps.spent.append(self)

    @classmethod
    def most(cls) -> int:
        return max((budget.start - min(budget.left, budget.start) for budget in cls.spent), default=0)


@pytest.mark.parametrize("count", [5, 7, 20, 39])
def test_bipartite_nvlink_selection_is_bounded(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """Issue: `gputopo select --count 5` took 8 s and a 7-GPU pod over 90 s on this board."""
    rings = _CountedRings(monkeypatch, STEPS_PER_SELECT)
    compiled = compile_topology(bipartite())
    for request in (Request(count), Request(count, Interconnect.NVLINK)):
        result = Selector().select(compiled, compiled.full_mask, request)
        assert rings.calls <= STEPS_PER_SELECT
        if isinstance(result, Choice):
            assert len(result.gpus) == count and set(result.gpus) <= set(range(40))
            assert result.ring_gbps is not None and result.ring_gbps >= 18.9 - 1e-9
        else:
            assert result.reason in (NoFitReason.INTERCONNECT, NoFitReason.BUDGET)
    plain = Selector().select(compiled, compiled.full_mask, Request(count))
    assert isinstance(plain, Choice), "an unconstrained request is always answered with a set"


def test_work_stays_within_the_budget_on_adversarial_boards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(select_module, "WorkBudget", _Steps)
    for board in (bipartite(), mesh(), ties(), bipartite(8), bridge_pairs()):
        compiled = compile_topology(board)
        for count in (2, 3, 5, 8, 16, board.size // 2 + 1, board.size):
            for request in (Request(count), Request(count, Interconnect.NVLINK), Request(count, min_ring_gbps=25)):
                _Steps.spent.clear()
                result = Selector().select(compiled, compiled.full_mask, request)
                assert _Steps.most() <= WORK_BUDGET + board.size ** 2, (board.size, count, request)
                assert isinstance(result, Choice | NoFit)


def test_full_meshes_and_full_ties_are_answered_exactly() -> None:
    """Uniform boards are the easy case for the bounds: the answer is exact, not the budget's fallback."""
    for board in (mesh(), ties()):
        compiled = compile_topology(board)
        per_numa = max(sum(1 for gpu in board.gpus if gpu.numa_node == numa) for numa in (0, 1))
        for count in (2, 7, 32, 64):
            choice = Selector().select(compiled, compiled.full_mask, Request(count))
            assert isinstance(choice, Choice) and choice.exact and len(choice.gpus) == count
            assert choice.numa_nodes == -(-count // per_numa)


def test_a_search_that_runs_out_answers_no_better_than_it_can_prove() -> None:
    compiled = compile_topology(bipartite())
    choice = Selector().select(compiled, compiled.full_mask, Request(5))
    assert isinstance(choice, Choice) and not choice.exact
    # Five GPUs cannot close a ring on NVLink alone here (it is bipartite), so the ring runs at SYS at best.
    assert choice.ring_gbps == pytest.approx(63.0 * 0.3) and choice.weakest is Level.SYS
    tight = Selector(budget=50).select(compiled, compiled.full_mask, Request(5, Interconnect.NVLINK))
    assert isinstance(tight, NoFit) and tight.reason is NoFitReason.BUDGET


def _pick(data: st.DataObject) -> Topology:
    """A board within the bounds: up to 24 GPUs, NVLink within the link budget, any PCIe levels and widths."""
    n = data.draw(st.integers(2, 24), label="gpus")
    model = data.draw(st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "NVIDIA L40S", "unknown"]))
    nvswitch = data.draw(st.booleans(), label="nvswitch")
    budget = 18 if model in ("NVIDIA H100 80GB HBM3", "unknown") else (6 if "V100" in model else 0)
    pairs, per_gpu = [], [0] * n
    if budget:
        for i in range(n):
            for j in range(i + 1, n):
                links = data.draw(st.sampled_from([0, 0, 1, 2, budget]))
                if links and (nvswitch or max(per_gpu[i], per_gpu[j]) + links <= budget):
                    pairs.append(NvLinkPair(i, j, links))
                    per_gpu[i] += links
                    per_gpu[j] += links
    linked = {(pair.a, pair.b) for pair in pairs}
    levels = [[None] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if (i, j) not in linked or data.draw(st.booleans()):
                levels[i][j] = levels[j][i] = data.draw(st.sampled_from(sorted(Level)[:-1]))
    gpus = tuple(Gpu(i, model, numa_node=data.draw(st.integers(0, 3)), pcie_gen=data.draw(st.integers(1, 6)),
                     pcie_width=data.draw(st.sampled_from([1, 2, 4, 8, 16, 32]))) for i in range(n))
    return Topology(gpus, tuple(pairs), nvswitch, tuple(tuple(row) for row in levels))


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_board_within_the_bounds_is_answered_within_the_budget(data: st.DataObject) -> None:
    topology = _pick(data)
    compiled = compile_topology(topology)
    free = data.draw(st.integers(1, compiled.full_mask), label="free")
    count = data.draw(st.integers(1, free.bit_count()), label="count")
    interconnect = data.draw(st.sampled_from(list(Interconnect)), label="interconnect")
    saved = select_module.WorkBudget
    select_module.WorkBudget = _Steps
    try:
        _Steps.spent.clear()
        result = Selector().select(compiled, free, Request(count, interconnect))
    finally:
        select_module.WorkBudget = saved
    assert _Steps.most() <= WORK_BUDGET + topology.size ** 2
    if isinstance(result, Choice):
        assert len(result.gpus) == count and all(free >> gpu & 1 for gpu in result.gpus)


def _forged(topology: Topology, gpus: tuple[Gpu, ...] | None = None,
            nvlinks: tuple[NvLinkPair, ...] | None = None) -> str:
    """An annotation with facts the model refuses, and the fingerprint they hash to: what a hostile writer
    with node-patch rights can put on a Node."""
    forged = copy.copy(topology)
    forged.__dict__.pop("fingerprint", None)
    if gpus is not None:
        object.__setattr__(forged, "gpus", gpus)
    if nvlinks is not None:
        object.__setattr__(forged, "nvlinks", nvlinks)
        object.__setattr__(forged, "_links", {(pair.a, pair.b): pair.links for pair in nvlinks})
    return encode_topology(forged)


def _cluster(hostile: dict[str, str], observed: datetime = NOW) -> ClusterState:
    """Two DGX H100 and a DGX-1 that report honestly, and the hostile nodes' annotations."""
    state = ClusterState(clock=lambda: NOW.timestamp() + 5)
    honest = {"dgx-a": "dgx-h100", "dgx-b": "dgx-h100", "v100": "dgx1-v100"}
    for name, platform in honest.items():
        topology = PLATFORMS[platform].topology()
        ids = [f"GPU{gpu.index}" for gpu in topology.gpus]
        annotations = {state.keys.topology: encode_topology(topology),
                       state.keys.state: encode_state(NodeState(frozenset(ids[:1]), frozenset(), observed, 1))}
        state.nodes.apply("ADDED", {"metadata": {"name": name, "annotations": annotations}})
    for name, text in hostile.items():
        annotations = {state.keys.topology: text,
                       state.keys.state: encode_state(NodeState(frozenset(), frozenset(), observed, 1))}
        state.nodes.apply("ADDED", {"metadata": {"name": name, "annotations": annotations}})
    return state


def _pod(state: ClusterState, gpus: int, interconnect: str | None = None) -> object:
    annotations = {}
    if interconnect:
        annotations = {state.keys.interconnect: interconnect, state.keys.placement: "required"}
    return parse_pod({"metadata": {"name": "p", "namespace": "ml", "uid": "u1", "annotations": annotations},
                      "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}},
                     state.keys)


def test_a_negative_pcie_width_fails_only_its_own_node() -> None:
    """Issue: Selector.select <-> _explain recursed without bound, so every required pod failed everywhere."""
    board = PLATFORMS["dgx1-v100"].topology()
    hostile = _forged(board, gpus=tuple(replace(gpu, pcie_width=-16) for gpu in board.gpus))
    state = _cluster({"evil": hostile})
    names = ["dgx-a", "evil", "dgx-b", "v100"]
    outcome = filter_nodes(state, Selector(), _pod(state, 4, "nvlink"), names)
    assert outcome.passed == ["dgx-a", "dgx-b", "v100"]
    assert outcome.reasons()[1] == {"evil": "GPU topology annotation is invalid"}
    scores = prioritize_nodes(state, Selector(), _pod(state, 4, "nvlink"), names)
    assert len(scores) == 4 and scores[1] == 0 and min(scores[0], scores[2]) > 0


def test_an_implausible_nvlink_count_steers_no_pod() -> None:
    """Issue: NV10^15 made the hostile node the best on offer, so every pod went there."""
    board = PLATFORMS["hgx-h100-4gpu"].topology()
    hostile = _forged(board, nvlinks=tuple(replace(pair, links=10 ** 15) for pair in board.nvlinks))
    state = _cluster({"evil": hostile})
    names = ["evil", "dgx-a", "dgx-b", "v100"]
    scores = prioritize_nodes(state, Selector(), _pod(state, 2), names)
    assert scores[0] == 0 and scores[1] == scores[2] == max(scores)
    assert filter_nodes(state, Selector(), _pod(state, 2), names).reasons()[1] == {
        "evil": "GPU topology annotation is invalid"}


def _report(state: ClusterState, name: str, platform: str, reported: NodeState) -> None:
    state.nodes.apply("MODIFIED", {"metadata": {"name": name, "annotations": {
        state.keys.topology: encode_topology(PLATFORMS[platform].topology()),
        state.keys.state: encode_state(reported)}}})


FAR_FUTURE = NodeState(frozenset(), frozenset(), datetime(9999, 12, 31, tzinfo=timezone.utc), 2)


@pytest.mark.parametrize(("reported", "reason"), [
    (NodeState(frozenset({f"GPU{i}" for i in range(8, 40)}), frozenset(), NOW, 2), "GPU state annotation is invalid"),
    (NodeState(frozenset(), frozenset({"GPU-elsewhere"}), NOW, 2), "GPU state annotation is invalid"),
    (FAR_FUTURE, "GPU state annotation is dated in the future"),
])
def test_a_state_naming_gpus_the_board_lacks_or_dated_ahead_is_refused(reported: NodeState, reason: str) -> None:
    """Issue: a state with more GPUs than the node had was read, and `observed` in the year 9999 kept a node
    fresh after its reporter stopped."""
    state = _cluster({})
    _report(state, "dgx-b", "dgx-h100", reported)
    outcome = filter_nodes(state, Selector(), _pod(state, 1), ["dgx-a", "dgx-b"])
    assert outcome.passed == ["dgx-a"]
    assert outcome.reasons()[1] == {"dgx-b": reason}


def test_refused_nodes_are_counted_by_reason_in_the_metric() -> None:
    board = PLATFORMS["dgx1-v100"].topology()
    state = _cluster({"evil": _forged(board, gpus=tuple(replace(gpu, pcie_width=-16) for gpu in board.gpus)),
                      "garbage": "{"})
    _report(state, "v100", "dgx1-v100", FAR_FUTURE)
    metrics = Metrics(state, GroupPlans(state))
    assert {reason: metrics.registry.get_sample_value("gpu_topology_extender_nodes_refused", {"reason": reason})
            for reason in ("topology-invalid", "state-invalid", "state-future")} == {
        "topology-invalid": 2.0, "state-invalid": 0.0, "state-future": 1.0}


def test_a_hostile_board_within_the_bounds_costs_other_nodes_a_bounded_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bipartite board passes every bound; filter and prioritize of a 5-GPU pod still answer for everyone."""
    rings = _CountedRings(monkeypatch, 8 * STEPS_PER_SELECT)
    state = _cluster({"evil": encode_topology(bipartite())})
    names = ["dgx-a", "evil", "dgx-b", "v100"]
    for pod in (_pod(state, 5), _pod(state, 5, "nvlink"), _pod(state, 7, "nvlink")):
        outcome = filter_nodes(state, Selector(), pod, names)
        assert {"dgx-a", "dgx-b"} <= set(outcome.passed)
        reasons = {**outcome.reasons()[0], **outcome.reasons()[1]}
        assert "evil" in outcome.passed or reasons["evil"] in (BUDGET, f"no free NVLink ring of {pod.gpus} GPUs")
        scores = prioritize_nodes(state, Selector(), pod, names)
        assert scores[0] == scores[2] > 0
    assert rings.calls <= 8 * STEPS_PER_SELECT


def test_the_compiled_board_cache_is_bounded() -> None:
    """Issue: every distinct topology stayed compiled (4,000 rewrites added 600 MB)."""
    base = PLATFORMS["pcie-l40s"].topology()
    for numa in range(300):
        compile_topology(replace(base, gpus=tuple(replace(gpu, numa_node=numa) for gpu in base.gpus)))
    assert len(compiled_module._compiled) <= 64


def test_a_plausible_tie_heavy_16_gpu_board_stays_exact() -> None:
    """The budget is far above what honest boards need: 16 bridge-paired GPUs, every k, all free."""
    compiled = compile_topology(bridge_pairs())
    for count in range(1, 17):
        for interconnect in (Interconnect.ANY, Interconnect.NVLINK, Interconnect.NUMA):
            result = Selector().select(compiled, compiled.full_mask, Request(count, interconnect))
            if isinstance(result, NoFit):
                assert result.reason is not NoFitReason.BUDGET, (count, interconnect)
            else:
                assert result.exact, (count, interconnect)


def test_a_reporter_rewriting_its_topology_keeps_no_dead_board_alive() -> None:
    """Issue: a writer publishing topology after topology grew memory without bound. The compile cache is
    bounded, but the interned node keys and the answer memos held every board they had seen: here 600
    rewrites while filter and prioritize run must leave at most the dead-board bound of them alive."""
    state = _cluster({})
    pod = _pod(state, 2)
    verdicts: ShapeMemo = ShapeMemo()
    offers: ShapeMemo = ShapeMemo()
    base = PLATFORMS["pcie-l40s"].topology()
    boards: list[weakref.ref[CompiledTopology]] = []
    for numa in range(600):
        board = replace(base, gpus=tuple(replace(gpu, numa_node=numa % 1024) for gpu in base.gpus))
        annotations = {state.keys.topology: encode_topology(board),
                       state.keys.state: encode_state(NodeState(frozenset(), frozenset(), NOW, numa))}
        state.nodes.apply("MODIFIED", {"metadata": {"name": "rewriter", "annotations": annotations}})
        view = state.view("rewriter")
        assert view is not None and view.compiled is not None
        boards.append(weakref.ref(view.compiled))
        del view
        names = ["dgx-a", "v100", "rewriter"]
        assert "rewriter" in filter_nodes(state, Selector(), pod, names, verdicts).passed
        assert prioritize_nodes(state, Selector(), pod, ["rewriter"], offers)[0] > 0  # scored as a live board
    gc.collect()
    alive = sum(ref() is not None for ref in boards)
    assert alive <= MAX_DEAD_BOARDS + compiled_module.MAX_COMPILED + 1
