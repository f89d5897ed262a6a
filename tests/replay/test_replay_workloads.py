"""The replay's clusters and workloads on the real trace files: the shipped copy against ../shared/traces, the
Alibaba fleet and pod trace against the counts the trace documents, the synthetic load calibration, FGD's
inflation and the user CSV's validation."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from loadtests.replay import clusters, derive_alibaba, workloads
from loadtests.replay.clusters import alibaba_fleet, installed_gpus, load_gpu_model_map, mixed_fleet, pool_capacity
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.workloads import (alibaba_trace, at_load, describe, inflation, offered_load, parse_gpu_mix,
                                        read_csv, synthetic, trace_statistics, unplaceable)
from topology.platforms import PLATFORMS
from helpers import paths

SHARED = paths.SHARED / "traces"


@pytest.fixture(scope="module")
def trace() -> tuple[Job, ...]:
    return alibaba_trace()


@pytest.fixture(scope="module")
def fleet() -> tuple[ClusterNode, ...]:
    return alibaba_fleet()


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is not on this machine")
def test_the_shipped_copy_is_what_the_derivation_makes_of_the_shared_trace() -> None:
    assert derive_alibaba.derived_pods(SHARED) == (derive_alibaba.DATA / derive_alibaba.PODS).read_bytes()
    assert derive_alibaba.derived_nodes(SHARED) == (derive_alibaba.DATA / derive_alibaba.NODES).read_bytes()


def test_the_trace_has_every_gpu_pod_with_its_arrival_duration_and_fractional_flag(trace: tuple[Job, ...]) -> None:
    assert len(trace) == 7064
    assert Counter(job.gpus for job in trace) == {1: 6989, 2: 16, 4: 15, 8: 44}
    fractional = [job for job in trace if job.fractional]
    assert len(fractional) == 3078 and {job.gpus for job in fractional} == {1}
    assert [job.submit_s for job in trace] == sorted(job.submit_s for job in trace)
    first = {job.name: job for job in trace}
    assert first["openb-pod-0000"] == Job("openb-pod-0000", 0.0, 12537496.0, 1, None, False)
    assert first["openb-pod-0001"] == Job("openb-pod-0001", 427061.0, 12902960.0 - 427061.0, 1, None, True)
    assert all(job.gpu_model is None and job.duration_s >= 0 for job in trace)


def test_the_synthetic_defaults_are_the_trace_statistics() -> None:
    stats = trace_statistics()
    assert stats.gpu_mix == workloads.TRACE_GPU_MIX
    assert stats.completed == 2054
    assert round(stats.duration_mu, 3) == workloads.TRACE_DURATION_MU
    assert round(stats.duration_sigma, 3) == workloads.TRACE_DURATION_SIGMA


def test_the_alibaba_fleet_has_the_trace_nodes_in_pools_with_their_gpu_counts(fleet: tuple[ClusterNode, ...]) -> None:
    assert len(fleet) == 1213
    assert pool_capacity(fleet) == {"G2": 4392, "T4": 842, "P100": 265, "G3": 312, "V100M16": 195,
                                    "V100M32": 204, "A10": 2}
    by_name = {node.name: node for node in fleet}
    assert by_name["openb-node-0000"] == ClusterNode("openb-node-0000", "pcie-8gpu-switch-tree", "P100", (0, 1))
    sizes = Counter((node.gpu_model, len(installed_gpus(node))) for node in fleet)
    assert sizes[("G2", 8)] == 549 and sizes[("T4", 2)] == 387 and sizes[("V100M16", 4)] == 28
    assert all(node.platform in PLATFORMS for node in fleet)


def test_every_mapping_states_why(fleet: tuple[ClusterNode, ...]) -> None:
    mappings = load_gpu_model_map()
    assert {(node.gpu_model, len(installed_gpus(node))) for node in fleet} == set(mappings)
    assert all(len(mapping.why) > 30 or mapping.gpus == 1 for mapping in mappings.values())


ENTRY = 'model = "T4"\ngpus = 2\nplatform = "pcie-l40s"\ninstalled = [0, 1]\nwhy = "a PCIe card"\n'


@pytest.mark.parametrize(("text", "message"), [
    ("[[map]]\n" + ENTRY.replace("pcie-l40s", "pcie-l40"), "platform 'pcie-l40' is not one of"),
    ("[[map]]\n" + ENTRY.replace("[0, 1]", "[0, 0]"), "installed must list 2 distinct GPU indices"),
    ("[[map]]\n" + ENTRY.replace("[0, 1]", "[0, 8]"), "installed must list 2 distinct GPU indices"),
    ("[[map]]\n" + ENTRY.replace('installed = [0, 1]\n', ""), "pcie-l40s has 8 GPUs, not 2: say which are installed"),
    ("[[map]]\n" + ENTRY + "[[map]]\n" + ENTRY, "entry 2: T4 with 2 GPUs is mapped twice"),
    ("[[map]]\n" + ENTRY + "colour = 1\n", "unknown keys ['colour']"),
    ("[[map]]\n" + ENTRY.replace('why = "a PCIe card"\n', ""), "missing ['why']"),
    ("[[map]]\n" + ENTRY.replace("gpus = 2", "gpus = true"), "gpus must be an integer"),
    ("[map\n", "Expected"),
])
def test_a_bad_mapping_file_is_one_line_naming_the_entry(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "map.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match="map.toml") as error:
        load_gpu_model_map(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_mapping_file_that_misses_a_trace_model_names_it(tmp_path: Path) -> None:
    path = tmp_path / "map.toml"
    path.write_text(clusters.GPU_MODEL_MAP.read_text().replace('model = "A10"', 'model = "A10G"'))
    with pytest.raises(ValueError, match="no entry for A10 with 1 GPUs"):
        alibaba_fleet(path)


def test_the_mixed_fleet_is_the_issue_platforms_one_pool_each() -> None:
    fleet = mixed_fleet(3)
    assert len(fleet) == 18
    assert {node.platform for node in fleet} == {"dgx-h100", "dgx-a100", "dgx1-v100", "rtx-a6000-pairs",
                                                 "pcie-l40s", "pcie-8gpu-switch-tree"}
    assert {pool: len({node.platform for node in fleet if node.gpu_model == pool})
            for pool in pool_capacity(fleet)} == dict.fromkeys(pool_capacity(fleet), 1)
    assert set(pool_capacity(fleet).values()) == {24}
    assert len({node.name for node in fleet}) == 18


def test_offered_load_caps_each_duration_at_the_arrival_window() -> None:
    jobs = [Job("a", 0.0, 50.0, 2), Job("b", 100.0, 1000.0, 4)]
    assert offered_load(jobs, mixed_fleet(1)) == pytest.approx((2 * 50 + 4 * 100) / (48 * 100))


@pytest.mark.parametrize("load", [0.5, 0.8, 0.95])
def test_synthetic_arrivals_offer_exactly_the_target_load(load: float) -> None:
    fleet = mixed_fleet(2)
    jobs = synthetic(fleet, load, jobs=500, seed=3)
    assert offered_load(jobs, fleet) == pytest.approx(load, rel=1e-9)
    assert [job.submit_s for job in jobs] == sorted(job.submit_s for job in jobs) and jobs[0].submit_s > 0


def test_the_trace_on_its_own_clock_barely_loads_its_fleet_and_compresses_to_a_target(
        trace: tuple[Job, ...], fleet: tuple[ClusterNode, ...]) -> None:
    assert 0.002 < offered_load(trace, fleet) < 0.003
    assert sum(job.submit_s >= trace[-1].submit_s / 2 for job in trace) / len(trace) > 0.99
    compressed = at_load(trace, mixed_fleet(4), 0.8)
    assert offered_load(compressed, mixed_fleet(4)) == pytest.approx(0.8, rel=1e-9)
    assert [(job.name, job.duration_s, job.gpus, job.fractional) for job in compressed] == [
        (job.name, job.duration_s, job.gpus, job.fractional) for job in trace]
    ratio = compressed[-1].submit_s / trace[-1].submit_s
    assert all(job.submit_s == pytest.approx(original.submit_s * ratio) for job, original in zip(compressed, trace))
    with pytest.raises(ValueError, match="out of reach: these jobs ask for 0.042 of capacity at most"):
        at_load([Job("a", 0.0, 50.0, 1), Job("b", 100.0, 50.0, 1)], mixed_fleet(1), 0.05)


def test_synthetic_is_deterministic_per_seed_and_follows_its_mix(fleet: tuple[ClusterNode, ...]) -> None:
    small = mixed_fleet(2)
    assert synthetic(small, 0.8, jobs=300, seed=7) == synthetic(small, 0.8, jobs=300, seed=7)
    assert synthetic(small, 0.8, jobs=300, seed=7) != synthetic(small, 0.8, jobs=300, seed=8)
    with pytest.raises(ValueError, match="out of reach"):
        synthetic(fleet, 0.8, jobs=300)
    jobs = synthetic(fleet, 0.9, jobs=4000, seed=1, gpu_mix={1: 1, 2: 1, 4: 1, 8: 1})
    shares = Counter(job.gpus for job in jobs)
    assert all(900 <= shares[size] <= 1100 for size in (1, 2, 4, 8))
    largest = clusters.largest_node(fleet)
    assert all(largest[job.gpu_model] >= job.gpus for job in jobs)
    assert {job.gpu_model for job in jobs if job.gpus == 8} == {"G2", "G3", "V100M16", "V100M32"}
    median = sorted(job.duration_s for job in synthetic(small, 0.8, jobs=4001, seed=2))[2000]
    assert median == pytest.approx(math.exp(workloads.TRACE_DURATION_MU), rel=0.1)


def test_synthetic_refuses_what_the_cluster_cannot_hold() -> None:
    with pytest.raises(ValueError, match="largest node"):
        synthetic(mixed_fleet(1), 0.8, gpu_mix={16: 1})
    with pytest.raises(ValueError, match="load must be"):
        synthetic(mixed_fleet(1), 0.0)


def test_inflation_submits_trace_pods_without_departures_until_130_percent(trace: tuple[Job, ...],
                                                                          fleet: tuple[ClusterNode, ...]) -> None:
    jobs = inflation(trace, fleet, seed=5)
    requested = [job.gpus for job in jobs]
    assert sum(requested) >= 1.3 * 6212 > sum(requested[:-1])
    assert all(math.isinf(job.duration_s) for job in jobs)
    assert [job.submit_s for job in jobs] == [float(i) for i in range(len(jobs))]
    source = {job.name: job for job in trace}
    for job in jobs:
        original = source[job.name.split("-", 2)[2]]
        assert (job.gpus, job.fractional, job.gpu_model) == (original.gpus, original.fractional, original.gpu_model)
    assert jobs == inflation(trace, fleet, seed=5) != inflation(trace, fleet, seed=6)


def _write(tmp_path: Path, text: str, name: str = "jobs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_user_csv_becomes_jobs_sorted_by_arrival(tmp_path: Path) -> None:
    path = _write(tmp_path, "\ufeffsubmit_time_s,duration_s,num_gpus,gpu_model\n"
                            "10,300,4,H100\n0,60.5,1,\n10,5,8,A100\n")
    assert read_csv(path) == (Job("csv-3", 0.0, 60.5, 1, None), Job("csv-2", 10.0, 300.0, 4, "H100"),
                              Job("csv-4", 10.0, 5.0, 8, "A100"))
    plain = _write(tmp_path, "submit_time_s,duration_s,num_gpus\n0,1,2\n", "plain.csv")
    assert read_csv(plain) == (Job("csv-2", 0.0, 1.0, 2, None),)


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty; the header is"),
    ("submit,duration,gpus\n0,1,1\n", ":1: header 'submit,duration,gpus'"),
    ("submit_time_s,duration_s,num_gpus\n", "no jobs after the header"),
    ("submit_time_s,duration_s,num_gpus\n0,1\n", ":2: 2 fields, expected 3"),
    ("submit_time_s,duration_s,num_gpus\n0,1,1\n-1,1,1\n", ":3: submit_time_s '-1' is not a number of seconds"),
    ("submit_time_s,duration_s,num_gpus\n0,nan,1\n", ":2: duration_s 'nan'"),
    ("submit_time_s,duration_s,num_gpus\n0,inf,1\n", ":2: duration_s 'inf'"),
    ("submit_time_s,duration_s,num_gpus\n0,0,1\n", ":2: duration_s '0' is not a number of seconds from more than 0"),
    ("submit_time_s,duration_s,num_gpus\n2e9,1,1\n", ":2: submit_time_s '2e9'"),
    ("submit_time_s,duration_s,num_gpus\n0,1,0\n", ":2: num_gpus '0' is not a whole number from 1 to 64"),
    ("submit_time_s,duration_s,num_gpus\n0,1,65\n", ":2: num_gpus '65'"),
    ("submit_time_s,duration_s,num_gpus\n0,1,2.5\n", ":2: num_gpus '2.5'"),
    ("submit_time_s,duration_s,num_gpus,gpu_model\n0,1,1,H100 80GB\n",
     ":2: gpu_model 'H100 80GB' is not a label value"),
    ("submit_time_s,duration_s,num_gpus,gpu_model\n0,1,1,-H100\n", ":2: gpu_model '-H100'"),
    ('submit_time_s,duration_s,num_gpus\n0,1,"1\n', "cannot be read as a UTF-8 CSV file"),
])
def test_a_bad_user_csv_is_one_line_naming_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ValueError) as error:
        read_csv(path)
    assert str(error.value).startswith(str(path)) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_a_user_csv_past_its_bounds_is_refused_before_it_is_parsed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "submit_time_s,duration_s,num_gpus\n" + "0,1,1\n" * 20)
    monkeypatch.setattr(workloads, "CSV_MAX_BYTES", 100)
    with pytest.raises(ValueError, match="bytes, more than the 100 allowed"):
        read_csv(path)
    monkeypatch.setattr(workloads, "CSV_MAX_BYTES", 1 << 20)
    monkeypatch.setattr(workloads, "CSV_MAX_ROWS", 19)
    with pytest.raises(ValueError, match="20 jobs, more than the 19 allowed"):
        read_csv(path)
    (tmp_path / "bytes.csv").write_bytes(b"submit_time_s,duration_s,num_gpus\n0,1,\xff\n")
    with pytest.raises(ValueError, match="cannot be read as a UTF-8 CSV file"):
        read_csv(tmp_path / "bytes.csv")
    with pytest.raises(ValueError, match="No such file"):
        read_csv(tmp_path / "missing.csv")


def test_jobs_no_node_could_ever_hold_are_named(fleet: tuple[ClusterNode, ...], trace: tuple[Job, ...]) -> None:
    assert unplaceable(trace, fleet) is None
    assert unplaceable([Job("a", 0, 1, 8, "T4")], fleet) == "a: 8 GPUs, more than a T4 node has (4)"
    assert unplaceable([Job("b", 0, 1, 1, "H100")], fleet).startswith("b: gpu_model 'H100' is not a pool")
    assert unplaceable([Job("c", 0, 1, 16)], fleet) == "c: 16 GPUs, more than any node has (8)"


def test_the_output_line_says_how_many_fractional_pods_count_as_one_gpu(trace: tuple[Job, ...]) -> None:
    assert describe(trace) == ("7,064 pods (6,989 x 1 GPU, 16 x 2 GPU, 15 x 4 GPU, 44 x 8 GPU); "
                               "3,078 fractional-GPU pods counted as 1 whole GPU")
    assert describe([Job("a", 0.0, 1.0, 2)]) == "1 pods (1 x 2 GPU)"


def test_a_gpu_mix_is_parsed_strictly() -> None:
    assert parse_gpu_mix("1:60, 2:20,4:12,8:8") == {1: 60.0, 2: 20.0, 4: 12.0, 8: 8.0}
    for bad in ("1:60,1:40", "0:1", "65:1", "2:0", "2:-1", "2:nan", "2", "two:1",
                ",".join(f"{i}:1" for i in range(1, 18))):
        with pytest.raises(ValueError, match="gpu mix"):
            parse_gpu_mix(bad)
