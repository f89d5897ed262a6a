"""The replayed workloads, each a sequence of Jobs sorted by arrival: (a) the Alibaba 2023 pod trace,
(b) a synthetic generator calibrated to a target load, (c) FGD's workload inflation, (d) a user's CSV, whose
rows may be multi-node jobs (`num_pods`). Any of them can be rescaled in time to a target load (`at_load`).

The synthetic defaults come from the Alibaba 2023 trace (`data/PROVENANCE.md`): its GPUs-per-pod mix and a
lognormal fitted to the durations of its completed GPU pods. `trace_statistics()` recomputes both from the
shipped copy, and a test holds the constants below to it.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import random
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loadtests.replay.clusters import installed_gpus, largest_node, pool_capacity
from loadtests.replay.derive_alibaba import DATA, PODS
from loadtests.replay.model import ClusterNode, Job
from topology.bounds import MAX_GPUS, MAX_GROUP_SIZE

TRACE_GPU_MIX: Mapping[int, int] = {1: 6989, 2: 16, 4: 15, 8: 44}
"""GPU pods of the Alibaba 2023 default pod list by GPUs requested (fractional pods count as 1), as weights."""

TRACE_DURATION_MU = 5.969
TRACE_DURATION_SIGMA = 1.630
"""ln(seconds) mean and standard deviation over the 2,054 GPU pods the trace saw end (Succeeded or Failed):
median 391 s, mean 1,479 s. Running pods are censored at the trace end and Pending pods never ran, so they are
left out of the fit; the completed pods lean short (1,855 of them Failed)."""


@dataclass(frozen=True, slots=True)
class TraceStatistics:
    """What the synthetic defaults are computed from."""

    gpu_mix: Mapping[int, int]
    duration_mu: float
    duration_sigma: float
    completed: int


def _trace_rows(path: Path) -> list[dict[str, str]]:
    with gzip.open(path, "rt", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def trace_statistics(path: Path = DATA / PODS) -> TraceStatistics:
    """The GPUs-per-pod mix and the lognormal fit of completed pods' durations, from the shipped trace copy."""
    rows = _trace_rows(path)
    mix = Counter(int(row["num_gpu"]) for row in rows)
    logs = [math.log(int(row["deletion_time"]) - int(row["creation_time"])) for row in rows
            if row["pod_phase"] in ("Succeeded", "Failed")]
    mu = sum(logs) / len(logs)
    sigma = math.sqrt(sum((x - mu) ** 2 for x in logs) / len(logs))
    return TraceStatistics(dict(sorted(mix.items())), mu, sigma, len(logs))


def alibaba_trace(path: Path = DATA / PODS) -> tuple[Job, ...]:
    """Every GPU pod of the trace: arrival at creation, duration until deletion (censored for pods still
    running at the trace end). A share of one GPU (gpu_milli < 1000) is one whole GPU, flagged `fractional`.
    The default pod list has no GPU-model constraint, so no pod selects a pool."""
    jobs = [Job(row["name"], float(row["creation_time"]),
                float(int(row["deletion_time"]) - int(row["creation_time"])), int(row["num_gpu"]),
                None, int(row["num_gpu"]) == 1 and int(row["gpu_milli"]) < 1000)
            for row in _trace_rows(path)]
    return tuple(sorted(jobs, key=lambda job: (job.submit_s, job.name)))


def synthetic(cluster: Sequence[ClusterNode], load: float, jobs: int = 2000, seed: int = 0,
              gpu_mix: Mapping[int, float] = TRACE_GPU_MIX, duration_mu: float = TRACE_DURATION_MU,
              duration_sigma: float = TRACE_DURATION_SIGMA, select_pool: bool = True) -> tuple[Job, ...]:
    """Poisson arrivals at exactly the target `offered_load`: exponential gaps, then one time scale for all of
    them (a Poisson process given its count), so a short run is not off target by the luck of its draws. Sizes
    follow `gpu_mix`, durations a lognormal. With `select_pool` each job names a pool that has a node big
    enough, chosen in proportion to pool capacity, so each pool sees the target load in expectation."""
    _check_load(load)
    if not 1 <= jobs <= 1_000_000:
        raise ValueError(f"jobs must be 1 to 1,000,000, not {jobs}")
    capacity, largest = pool_capacity(cluster), largest_node(cluster)
    sizes = sorted(gpu_mix)
    if not sizes or any(not 1 <= size <= max(largest.values()) for size in sizes) or min(gpu_mix.values()) <= 0:
        raise ValueError(f"gpu_mix {dict(gpu_mix)}: sizes must fit the largest node ({max(largest.values())}) "
                         "and weights be positive")
    pools = {size: sorted(name for name, most in largest.items() if most >= size) for size in sizes}
    weights = {size: [capacity[name] for name in pools[size]] for size in sizes}
    rng = random.Random(seed)
    drawn: list[Job] = []
    submit = 0.0
    for index, size in enumerate(rng.choices(sizes, weights=[gpu_mix[size] for size in sizes], k=jobs)):
        pool = rng.choices(pools[size], weights=weights[size])[0] if select_pool else None
        submit += rng.expovariate(1.0)
        drawn.append(Job(f"syn-{index:06d}", submit, rng.lognormvariate(duration_mu, duration_sigma), size, pool))
    return at_load(drawn, cluster, load)


def offered_load(jobs: Sequence[Job], cluster: Sequence[ClusterNode]) -> float:
    """λ·E[GPUs × duration] ÷ capacity, the queueing definition, measured over the arrival window (0 to the
    last arrival) with each duration capped at the window's length: a pod that outlives the whole window asks
    for the window, not for more. For a steady stream the cap changes nothing; for the Alibaba trace it keeps
    150 censored pods (93 % of its GPU-seconds, months long) from passing for load."""
    return _load(_parts(jobs), _window(jobs), _capacity(cluster))


def at_load(jobs: Sequence[Job], cluster: Sequence[ClusterNode], load: float) -> tuple[Job, ...]:
    """The same jobs with their arrival times scaled by one factor (durations and order kept) so that their
    `offered_load` is `load`. The Alibaba 2023 pod list offers its own fleet 0.3 % on its 149-day clock: it
    is a sample of pods (FGD inflates it rather than replaying its clock), so replayed in time it must be
    compressed. The load climbs as the window shrinks, up to all the GPUs asked for at once (a load above
    that is refused)."""
    _check_load(load)
    parts, window, capacity = _parts(jobs), _window(jobs), _capacity(cluster)
    ceiling = sum(gpus for gpus, duration in parts if duration > 0) / capacity
    if load >= ceiling:
        raise ValueError(f"load {load} is out of reach: these jobs ask for {ceiling:.3f} of capacity at most")
    low, high = 1e-12, 1e12  # the factor: the load falls as it grows (each job's share min(d/fW, 1) does)
    for _ in range(200):
        middle = math.sqrt(low * high)
        if _load(parts, window * middle, capacity) > load:
            low = middle
        else:
            high = middle
        if high / low < 1 + 1e-13:
            break
    return tuple(replace(job, submit_s=job.submit_s * high) for job in jobs)


def _parts(jobs: Sequence[Job]) -> list[tuple[int, float]]:
    return [(job.gpus, job.duration_s) for job in jobs]


def _load(parts: list[tuple[int, float]], window: float, capacity: int) -> float:
    """The offered load over `window`, each duration capped at the window."""
    return sum(gpus * min(duration, window) for gpus, duration in parts) / (capacity * window)


def _window(jobs: Sequence[Job]) -> float:
    window = jobs[-1].submit_s if jobs else 0.0
    if not 0 < window < math.inf:
        raise ValueError("the workload needs arrivals after 0 s to have a load")
    return window


def _capacity(cluster: Sequence[ClusterNode]) -> int:
    return sum(pool_capacity(cluster).values())


def _check_load(load: float) -> None:
    if not 0.05 <= load <= 2.0:
        raise ValueError(f"load must be 0.05 to 2.0 of capacity, not {load}")


def parse_gpu_mix(text: str) -> dict[int, float]:
    """`1:60,2:20,4:12,8:8` (GPUs per pod : weight), for a mix other than the trace's; at most 16 sizes."""
    mix: dict[int, float] = {}
    for part in text.split(",")[:17]:
        size, _, weight = part.strip().partition(":")
        try:
            gpus, share = int(size), float(weight)
        except ValueError:
            raise ValueError(f"gpu mix {text[:80]!r}: expected GPUS:WEIGHT pairs such as 1:60,2:20,4:12,8:8") from None
        if not 1 <= gpus <= MAX_GPUS or not (math.isfinite(share) and share > 0) or gpus in mix:
            raise ValueError(f"gpu mix {text[:80]!r}: {part.strip()!r} needs distinct GPUs 1 to {MAX_GPUS} "
                             "and a positive weight")
        mix[gpus] = share
    if len(mix) > 16:
        raise ValueError(f"gpu mix {text[:80]!r}: more than 16 sizes")
    return mix


def describe(jobs: Sequence[Job]) -> str:
    """One line for the output: how many pods of each size, how many fractional pods were counted as 1, and how
    many multi-node jobs the pods make."""
    sizes = Counter(job.gpus for job in jobs)
    fractional = sum(job.fractional for job in jobs)
    mix = ", ".join(f"{sizes[size]:,} x {size} GPU" for size in sorted(sizes))
    note = f"; {fractional:,} fractional-GPU pods counted as 1 whole GPU" if fractional else ""
    groups = {job.group: job.pods for job in jobs if job.group is not None}
    if groups:
        note += (f"; {sum(groups.values()):,} of them in {len(groups):,} multi-node jobs of "
                 f"{min(groups.values())}-{max(groups.values())} pods")
    return f"{len(jobs):,} pods ({mix}){note}"


def inflation(base: Sequence[Job], cluster: Sequence[ClusterNode], seed: int = 0,
              until: float = 1.3) -> tuple[Job, ...]:
    """FGD's workload inflation (Weng et al., ATC '23, §6.1): pods drawn at random, with replacement, from
    `base` and submitted one a second, none ever leaving, until the GPUs requested reach `until` × capacity.
    FGD counts a fractional pod's share; here it counts as a whole GPU (as everywhere in this replay), so the
    x-axis of the allocation curve is GPUs requested, not FGD's milli-GPUs."""
    if not 0.1 <= until <= 5.0:
        raise ValueError(f"until must be 0.1 to 5.0 of capacity, not {until}")
    if not base:
        raise ValueError("inflation needs a non-empty base workload")
    target = until * sum(pool_capacity(cluster).values())
    rng = random.Random(seed)
    out: list[Job] = []
    requested = 0
    while requested < target:
        job = base[rng.randrange(len(base))]
        out.append(Job(f"inf-{len(out):06d}-{job.name}", float(len(out)), math.inf, job.gpus, job.gpu_model,
                       job.fractional))
        requested += job.gpus
    return tuple(out)


CSV_COLUMNS = ("submit_time_s", "duration_s", "num_gpus")
CSV_OPTIONAL = ("num_pods", "gpu_model", "time_limit_s", "segment_pods")
CSV_HEADER = f"{','.join(CSV_COLUMNS)}[,num_pods][,gpu_model][,time_limit_s][,segment_pods]"
CSV_MAX_BYTES = 64 << 20
CSV_MAX_ROWS = 1_000_000
CSV_MAX_PODS = 1_000_000
CSV_MAX_SECONDS = 1e9
"""A user's job list is untrusted input: at most 64 MiB and 1,000,000 pods (a 2-core replay of more would
not end), times up to 10^9 s (31 years), GPUs per pod up to topology.bounds.MAX_GPUS and pods per job up to
topology.bounds.MAX_GROUP_SIZE."""

LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
"""A Kubernetes label value: what a node selector on the GPU model can hold."""


def read_csv(path: Path) -> tuple[Job, ...]:
    """A user's job list, `submit_time_s,duration_s,num_gpus` then `num_pods`, `gpu_model`, `time_limit_s` and
    `segment_pods` if wanted, in any order, with that header, checked row by row; the first problem is one line
    naming the file and line. A row of `num_pods` > 1 is a multi-node job: that many pods of `num_gpus` each
    (model.py), in segments of `segment_pods` if given (a divisor of `num_pods`, as Slurm's `--segment` must be).
    Jobs are sorted by submit time, ties in file order."""
    try:
        size = os.stat(path).st_size
    except OSError as error:
        raise ValueError(f"{path}: {error.strerror}") from None
    if size > CSV_MAX_BYTES:
        raise ValueError(f"{path}: {size} bytes, more than the {CSV_MAX_BYTES} allowed")
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = list(csv.reader(handle, strict=True))
    except (UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"{path}: cannot be read as a UTF-8 CSV file ({error})") from None
    if not rows:
        raise ValueError(f"{path}: empty; the header is {CSV_HEADER}")
    header = tuple(cell.strip() for cell in rows[0])
    extra = header[len(CSV_COLUMNS):]
    if header[:len(CSV_COLUMNS)] != CSV_COLUMNS or len(set(extra)) != len(extra) or not set(extra) <= set(CSV_OPTIONAL):
        raise ValueError(f"{path}:1: header {','.join(header)!r}; expected {CSV_HEADER} (those in any order)")
    if len(rows) - 1 > CSV_MAX_ROWS:
        raise ValueError(f"{path}: {len(rows) - 1} jobs, more than the {CSV_MAX_ROWS} allowed")
    if len(rows) == 1:
        raise ValueError(f"{path}: no jobs after the header")
    jobs = [job for line, row in enumerate(rows[1:], 2) for job in _csv_jobs(row, header, path, line)]
    if len(jobs) > CSV_MAX_PODS:
        raise ValueError(f"{path}: {len(jobs)} pods, more than the {CSV_MAX_PODS} allowed")
    return tuple(sorted(jobs, key=lambda job: job.submit_s))


def _csv_jobs(row: list[str], header: tuple[str, ...], path: Path, line: int) -> tuple[Job, ...]:
    where = f"{path}:{line}"
    if len(row) != len(header):
        raise ValueError(f"{where}: {len(row)} fields, expected {len(header)} ({','.join(header)})")
    cells = dict(zip(header, (cell.strip() for cell in row)))
    submit = _seconds(cells["submit_time_s"], "submit_time_s", where, zero_ok=True)
    duration = _seconds(cells["duration_s"], "duration_s", where, zero_ok=False)
    gpus = _count(cells["num_gpus"], "num_gpus", MAX_GPUS, where)
    pods = _count(cells.get("num_pods") or "1", "num_pods", MAX_GROUP_SIZE, where)
    model = cells.get("gpu_model") or None
    limit = _seconds(cells["time_limit_s"], "time_limit_s", where, zero_ok=False) if cells.get("time_limit_s") else None
    if model is not None and not LABEL_VALUE.fullmatch(model):
        raise ValueError(f"{where}: gpu_model {model[:80]!r} is not a label value "
                         "(1-63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)")
    segment = _count(cells["segment_pods"], "segment_pods", pods, where) if cells.get("segment_pods") else None
    if segment is not None and pods % segment:
        raise ValueError(f"{where}: segment_pods {segment} does not divide num_pods {pods}")
    if pods == 1:
        return (Job(f"csv-{line}", submit, duration, gpus, model, time_limit_s=limit),)
    return tuple(Job(f"csv-{line}-{member}", submit, duration, gpus, model, group=f"csv-{line}", pods=pods,
                     segment_pods=segment, time_limit_s=limit) for member in range(pods))


def _count(cell: str, column: str, most: int, where: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", cell) or not 1 <= int(cell) <= most:
        raise ValueError(f"{where}: {column} {cell[:40]!r} is not a whole number from 1 to {most}")
    return int(cell)


def _seconds(cell: str, column: str, where: str, zero_ok: bool) -> float:
    try:
        value = float(cell)
    except ValueError:
        value = math.nan
    low = "0" if zero_ok else "more than 0"
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok) or value > CSV_MAX_SECONDS:
        raise ValueError(f"{where}: {column} {cell[:40]!r} is not a number of seconds from {low} to "
                         f"{CSV_MAX_SECONDS:.0e}")
    return value


def unplaceable(jobs: Sequence[Job], cluster: Sequence[ClusterNode]) -> str | None:
    """Why some job could never run on this cluster (an unknown pool, more GPUs than any node of its pool has,
    or a multi-node job with more pods than its pool holds at once), for the first such job; None when every job
    fits somewhere empty. Such a job would wait forever."""
    largest = largest_node(cluster)
    anywhere = max(largest.values())
    checked: set[str] = set()
    for job in jobs:
        if job.gpu_model is not None and job.gpu_model not in largest:
            return (f"{job.name}: gpu_model {job.gpu_model!r} is not a pool of this cluster "
                    f"({', '.join(sorted(largest))})")
        most = anywhere if job.gpu_model is None else largest[job.gpu_model]
        where = "any node" if job.gpu_model is None else f"a {job.gpu_model} node"
        if job.gpus > most:
            return f"{job.name}: {job.gpus} GPUs, more than {where} has ({most})"
        if job.group is not None and job.group not in checked:
            checked.add(job.group)
            held = sum(len(installed_gpus(node)) // job.gpus for node in cluster
                       if job.gpu_model in (None, node.gpu_model))
            if job.pods > held:
                return (f"{job.group}: {job.pods} pods of {job.gpus} GPUs, more than its pool holds at once "
                        f"({held})")
    return None
