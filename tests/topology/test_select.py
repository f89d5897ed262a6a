"""Selection against brute force on every bundled real platform, plus the behaviour the issue names."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.brute_force import best_subset, ring_mbps
from topology.compiled import compile_topology
from topology.levels import Interconnect, Level
from topology.platforms import PLATFORMS
from topology.select import Choice, NoFit, NoFitReason, Request, Selector, extend_best, ring_gbps

SELECTOR = Selector()


def _check_against_brute_force(name: str, free: tuple[int, ...], interconnect: Interconnect,
                               min_gbps: float) -> None:
    compiled = compile_topology(PLATFORMS[name].topology())
    for k in range(1, len(free) + 1):
        request = Request(k, interconnect, min_gbps)
        got = SELECTOR.select(compiled, free, request)
        expected = best_subset(compiled, free, k, interconnect.min_level if k > 1 else interconnect.ANY.min_level,
                               round(min_gbps * 1000) if k > 1 else 0)
        if expected is None:
            assert isinstance(got, NoFit), (name, free, k, got)
            continue
        assert isinstance(got, Choice), (name, free, k, got, expected)
        subset, (ring, total, numa, cut) = expected
        assert got.gpus == subset, (name, free, k)
        assert got.exact is True, "every bundled board is searched whole within the work budget"
        assert got.ring_gbps == (None if k == 1 else ring / 1000)
        assert round(got.total_gbps * 1000) == total
        assert got.numa_nodes == numa
        assert round(got.cut_gbps * 1000) == cut


def _free_masks(size: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.sets(st.integers(0, size - 1), min_size=1).map(lambda s: tuple(sorted(s)))


@pytest.mark.parametrize("name", sorted(PLATFORMS))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(data=st.data())
def test_matches_brute_force_for_every_k(name: str, data: st.DataObject) -> None:
    size = PLATFORMS[name].topology().size
    free = data.draw(_free_masks(size), label="free")
    _check_against_brute_force(name, free, Interconnect.ANY, 0.0)


@pytest.mark.parametrize("name", ["dgx1-v100", "rtx-a6000-pairs", "pcie-8gpu-switch-tree", "pcie-l40s",
                                  "hgx-h100-4gpu"])
@settings(max_examples=100, deadline=None, database=None)
@given(data=st.data())
def test_constrained_matches_brute_force(name: str, data: st.DataObject) -> None:
    size = PLATFORMS[name].topology().size
    free = data.draw(_free_masks(size), label="free")
    interconnect = data.draw(st.sampled_from(list(Interconnect)), label="interconnect")
    min_gbps = data.draw(st.sampled_from([0.0, 5.0, 15.75, 30.0, 100.0]), label="min_gbps")
    _check_against_brute_force(name, free, interconnect, min_gbps)


def _compiled(name: str):
    return compile_topology(PLATFORMS[name].topology())


def test_dgx1_pair_is_nv2_inside_one_socket_and_quad_is_a_socket() -> None:
    topology = PLATFORMS["dgx1-v100"].topology()
    compiled = _compiled("dgx1-v100")
    pair = Selector().select(compiled, compiled.full_mask, Request(2))
    assert isinstance(pair, Choice)
    a, b = pair.gpus
    assert topology.nvlink_count(a, b) == 2
    assert topology.gpus[a].numa_node == topology.gpus[b].numa_node
    quad = Selector().select(compiled, compiled.full_mask, Request(4))
    assert isinstance(quad, Choice)
    assert quad.gpus in {(0, 1, 2, 3), (4, 5, 6, 7)}


def test_rtx_a6000_single_gpu_pods_fill_whole_pairs() -> None:
    topology = PLATFORMS["rtx-a6000-pairs"].topology()
    compiled = _compiled("rtx-a6000-pairs")
    selector = Selector()
    free = set(range(8))
    for _ in range(4):
        one = selector.select(compiled, free, Request(1))
        assert isinstance(one, Choice)
        free -= set(one.gpus)
    for _ in range(2):
        two = selector.select(compiled, free, Request(2))
        assert isinstance(two, Choice)
        assert topology.nvlink_count(*two.gpus) == 4, (free, two)
        free -= set(two.gpus)


def test_nvswitch_boards_keep_numa_whole_for_the_next_pod() -> None:
    compiled = _compiled("dgx-h100")
    selector = Selector()
    first = selector.select(compiled, range(8), Request(2))
    assert isinstance(first, Choice) and first.gpus == (0, 1)
    second = selector.select(compiled, set(range(8)) - {0, 1}, Request(4))
    assert isinstance(second, Choice) and second.gpus == (4, 5, 6, 7)


def test_nvlink_requirement_explains_what_is_free() -> None:
    compiled = _compiled("dgx1-v100")
    result = Selector().select(compiled, [0, 1, 4, 6], Request(4, Interconnect.NVLINK))
    assert isinstance(result, NoFit)
    assert result.reason is NoFitReason.INTERCONNECT
    assert result.message == ("best ring with 4 free GPUs is 4.7 GB/s over SYS; "
                              "nvlink needs 4 GPUs on an NVLink ring, 2 free")


def test_min_bandwidth_and_too_few() -> None:
    compiled = _compiled("dgx-a100")
    selector = Selector()
    short = selector.select(compiled, [0, 1, 2], Request(4))
    assert isinstance(short, NoFit) and short.reason is NoFitReason.TOO_FEW_GPUS
    assert short.message == "needs 4 GPUs, 3 free"
    slow = selector.select(compiled, range(8), Request(2, min_ring_gbps=301))
    assert isinstance(slow, NoFit) and slow.reason is NoFitReason.BANDWIDTH
    assert "300.0 GB/s" in slow.message and "at least 301.0 GB/s" in slow.message
    fine = selector.select(compiled, range(8), Request(2, min_ring_gbps=300))
    assert isinstance(fine, Choice) and fine.ring_gbps == 300.0


def test_memo_returns_the_same_answer_and_counts_entries() -> None:
    compiled = _compiled("dgx1-v100")
    selector = Selector()
    first = selector.select(compiled, 0b10110110, Request(3))
    assert selector.select(compiled, 0b10110110, Request(3)) is first
    assert len(selector) == 1
    assert selector.precompute(compiled) == sum(bin(m).count("1") for m in range(1, 256))


def test_ring_gbps_of_any_set() -> None:
    compiled = _compiled("dgx1-v100")
    assert ring_gbps(compiled, [0]) is None
    assert ring_gbps(compiled, [0, 3]) == 50.0
    assert ring_gbps(compiled, [0, 5]) == pytest.approx(4.725)
    assert ring_gbps(compiled, range(8)) == 50.0


def test_bad_requests_are_clear_errors() -> None:
    compiled = _compiled("dgx1-v100")
    with pytest.raises(ValueError, match="at least 1 GPU"):
        Request(0)
    with pytest.raises(ValueError, match="finite"):
        Request(2, min_ring_gbps=float("nan"))
    with pytest.raises(ValueError, match="beyond"):
        Selector().select(compiled, [9], Request(1))


def test_a_ring_of_the_kind_that_misses_only_the_bandwidth_is_reported_as_bandwidth() -> None:
    # DGX H100: every pair is NVLink at 450 GB/s, so an NVLink ring of 4 exists; 1000 GB/s is what it misses.
    compiled = compile_topology(PLATFORMS["dgx-h100"].topology())
    result = Selector().select(compiled, compiled.full_mask, Request(4, Interconnect.NVLINK, 1000.0))
    assert isinstance(result, NoFit) and result.reason is NoFitReason.BANDWIDTH
    assert "needs 4 GPUs" not in result.message and "the pod needs at least 1000.0 GB/s" in result.message


def _greedy_by_its_rule(mbps, free: tuple[int, ...], k: int) -> tuple[int, ...]:
    """select.py's documented fallback, written out plainly: first the GPU with the fastest link, then each time
    the one whose slowest link to those picked is fastest, then with the most bandwidth to them, then the lowest."""
    chosen = [max(free, key=lambda i: (max((mbps[i][j] for j in free if j != i), default=0), -i))]
    while len(chosen) < k:
        rest = [j for j in free if j not in chosen]
        chosen.append(max(rest, key=lambda j: (min(mbps[c][j] for c in chosen), sum(mbps[c][j] for c in chosen),
                                               -j)))
    return tuple(sorted(chosen))


@pytest.mark.parametrize("name", ["dgx1-v100", "dgx2-v100", "rtx-a6000-pairs", "pcie-8gpu-switch-tree"])
def test_the_budget_fallback_reports_the_set_it_picked(name: str) -> None:
    """Past the work budget with no set found, the greedy pick answers (exact=False). Its set follows its rule,
    and its figures are those of that set, worked out here the obvious way: prioritize scores and packs nodes by
    them, so a total, cut or NUMA count that is not the set's own misplaces pods on a tangled board."""
    topology = PLATFORMS[name].topology()
    compiled = compile_topology(topology)
    mbps, levels = compiled.mbps, compiled.levels
    numa_of = {gpu.index: gpu.numa_node for gpu in topology.gpus}
    last_numa = tuple(i for i in range(topology.size) if numa_of[i] == max(numa_of.values()))
    for free in (tuple(range(1, topology.size)), last_numa):  # GPU 0 taken; one NUMA node's GPUs alone
        for k in range(2, len(free) + 1):
            got = Selector(budget=1).select(compiled, free, Request(k))
            assert isinstance(got, Choice) and got.exact is False, (name, k, got)
            assert got.gpus == _greedy_by_its_rule(mbps, free, k), (name, free, k)
            pairs = [(i, j) for i in got.gpus for j in got.gpus if i < j]
            slowest = min(mbps[i][j] for i, j in pairs)
            assert got.ring_gbps == slowest / 1000, "the slowest pair: a ring any order of the set has"
            assert got.weakest in {levels[i][j] for i, j in pairs if mbps[i][j] == slowest}
            assert round(got.total_gbps * 1000) == sum(mbps[i][j] for i, j in pairs)
            assert round(got.cut_gbps * 1000) == sum(mbps[i][j] for i in got.gpus for j in free if j not in got.gpus)
            assert got.numa_nodes == len({numa_of[i] for i in got.gpus})


@pytest.mark.parametrize("name", ["dgx1-v100", "rtx-a6000-pairs", "pcie-8gpu-switch-tree"])
def test_extend_best_adds_the_gpus_that_make_the_best_ring_with_those_given(name: str) -> None:
    """extend_best splits a pod's set among its containers (topology/containers.py) and the agent's claims: the
    `extra` GPUs of the pool that, with every GPU given, make the best ring, then the most pair bandwidth. Checked
    against every candidate set; with nothing given, it is the selector's own best set of the pool."""
    compiled = compile_topology(PLATFORMS[name].topology())
    mbps = compiled.mbps
    size = compiled.size
    for must_gpus in ((0,), (1, 6), (3, 4, 5)):
        must = sum(1 << i for i in must_gpus)
        pool = compiled.full_mask & ~(1 << 7)  # GPU 7 is not in the pool
        candidates = [i for i in range(size) if pool >> i & 1 and not must >> i & 1]
        for extra in range(1, 4):
            got = extend_best(SELECTOR, compiled, must, pool, extra)
            added = tuple(i for i in range(size) if got >> i & 1)
            assert len(added) == extra and set(added) <= set(candidates), (name, must_gpus, extra, added)

            def key(chosen: tuple[int, ...]) -> tuple[int, int]:
                members = tuple(sorted(must_gpus + chosen))
                return (ring_mbps(compiled, members, Level.SYS),
                        sum(mbps[i][j] for i in members for j in members if i < j))

            assert key(added) == max(key(c) for c in combinations(candidates, extra)), (name, must_gpus, extra)
    for extra in range(2, 5):  # nothing given: the selector's best set of the pool
        got = extend_best(SELECTOR, compiled, 0, compiled.full_mask & ~1, extra)
        best = SELECTOR.select(compiled, compiled.full_mask & ~1, Request(extra))
        assert got == sum(1 << i for i in best.gpus), (name, extra)


def test_a_search_cut_short_after_a_find_answers_that_set_unproven(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that runs out after the search found a set answers the best set found so far (exact=False), not the
    greedy fallback, which is for a search that found nothing. On the DGX-1V, 500 steps find a 3-GPU NVLink ring at
    the best bandwidth before they run out (the proof that none beats it takes more)."""
    import topology.select as select_module

    def no_fallback(*args: object) -> None:
        raise AssertionError("the greedy fallback answered a search that had found a set")

    monkeypatch.setattr(select_module, "_greedy", no_fallback)
    compiled = _compiled("dgx1-v100")
    proven = Selector().select(compiled, compiled.full_mask, Request(3))
    cut_short = Selector(budget=500).select(compiled, compiled.full_mask, Request(3))
    assert isinstance(proven, Choice) and proven.exact is True
    assert isinstance(cut_short, Choice) and cut_short.exact is False
    assert cut_short.ring_gbps == proven.ring_gbps and len(cut_short.gpus) == 3
