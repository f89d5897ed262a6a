"""The replayed clusters: (a) a mixed fleet of the bundled real platforms, one GPU-model pool each, (b) the
Alibaba 2023 fleet, its trace models mapped to platforms by an editable file (`gpu_model_map.toml`), and (c) a
fleet for multi-node jobs: GB200 NVL72 racks beside HGX H100 nodes, under leaf and spine labels.

Pods select a pool by its label (`ClusterNode.gpu_model`), as real clusters do with a node selector, so
policies are compared within a pool, never across hardware generations.
"""

from __future__ import annotations

import csv
import tomllib
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.replay.derive_alibaba import DATA, NODES
from loadtests.replay.model import LEAF_LABEL, SPINE_LABEL, ClusterNode
from topology.fabric import CLIQUE_LABEL
from topology.platforms import PLATFORMS

GPU_MODEL_MAP = Path(__file__).parent / "gpu_model_map.toml"

MIXED_POOLS: tuple[tuple[str, str], ...] = (
    ("H100", "dgx-h100"),
    ("A100", "dgx-a100"),
    ("V100", "dgx1-v100"),
    ("A6000", "rtx-a6000-pairs"),
    ("L40S", "pcie-l40s"),
    ("PCIe-tree", "pcie-8gpu-switch-tree"),
)
"""(pool label, platform): the issue's mixed fleet. The switch-tree capture names no GPU model, so its pool is
named after its shape."""


def mixed_fleet(nodes_per_pool: int = 4) -> tuple[ClusterNode, ...]:
    """Every pool of MIXED_POOLS with the same number of whole boards."""
    if not 1 <= nodes_per_pool <= 1000:
        raise ValueError(f"nodes_per_pool must be 1 to 1000, not {nodes_per_pool}")
    return tuple(ClusterNode(f"{pool.lower()}-{i}", platform, pool)
                 for pool, platform in MIXED_POOLS for i in range(1, nodes_per_pool + 1))


NVL72_NODES_PER_RACK = 18
"""An NVL72 rack: 18 compute trays of 4 GB200 in one NVLink domain (the DRA driver's
defaultMaxNodesPerIMEXDomain, shared/topologies/FACTS-gb200-mnnvl.txt)."""
NVL72_CLIQUE_ID = 1
"""Every rack's cliqueId: racks differ by their cluster UUID alone, as two racks may share a cliqueId."""


def nvl72_fleet(racks: int = 4, racks_per_leaf: int = 2, hgx_leaves: int = 2,
                hgx_per_leaf: int = 12) -> tuple[ClusterNode, ...]:
    """GB200 NVL72 racks (pool GB200: 18 `gb200-node` trays each, one `nvidia.com/gpu.clique` per rack) under
    leaves of `racks_per_leaf` racks on one spine, and HGX H100 nodes (pool H100: `dgx-h100`) in `hgx_leaves`
    leaves of `hgx_per_leaf` on another. Every node carries Topograph's spine and leaf labels."""
    if not (1 <= racks <= 64 and 1 <= racks_per_leaf <= 64 and 0 <= hgx_leaves <= 64
            and 1 <= hgx_per_leaf <= 128):
        raise ValueError(f"nvl72 fleet: {racks} racks ({racks_per_leaf} a leaf) and {hgx_leaves} HGX leaves of "
                         f"{hgx_per_leaf} are out of bounds")
    nodes: list[ClusterNode] = []
    for rack in range(racks):
        clique = f"{uuid.uuid5(uuid.NAMESPACE_URL, f'replay/nvl72/rack-{rack}')}.{NVL72_CLIQUE_ID}"
        labels = ((CLIQUE_LABEL, clique), (SPINE_LABEL, "spine-1"), (LEAF_LABEL, f"leaf-{rack // racks_per_leaf + 1}"))
        nodes += [ClusterNode(f"gb200-r{rack + 1}-{tray:02d}", "gb200-node", "GB200", labels=labels)
                  for tray in range(1, NVL72_NODES_PER_RACK + 1)]
    first_hgx_leaf = (racks + racks_per_leaf - 1) // racks_per_leaf + 1
    for leaf in range(first_hgx_leaf, first_hgx_leaf + hgx_leaves):
        labels = ((SPINE_LABEL, "spine-2"), (LEAF_LABEL, f"leaf-{leaf}"))
        nodes += [ClusterNode(f"h100-l{leaf}-{node:02d}", "dgx-h100", "H100", labels=labels)
                  for node in range(1, hgx_per_leaf + 1)]
    return tuple(nodes)


@dataclass(frozen=True, slots=True)
class ModelMapping:
    """One entry of the mapping file: the trace's nodes of `model` with `gpus` GPUs are `platform` boards."""

    model: str
    gpus: int
    platform: str
    installed: tuple[int, ...] | None
    why: str


_KEYS = {"model", "gpus", "platform", "installed", "why"}


def load_gpu_model_map(path: Path = GPU_MODEL_MAP) -> dict[tuple[str, int], ModelMapping]:
    """The mapping file, checked entry by entry: users edit it, so every mistake is one line naming the entry."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"{path}: {error}") from None
    entries = document.get("map")
    if set(document) != {"map"} or not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: expected only [[map]] entries")
    mappings: dict[tuple[str, int], ModelMapping] = {}
    for number, entry in enumerate(entries, 1):
        mapping = _mapping(entry, f"{path}: [[map]] entry {number}")
        key = (mapping.model, mapping.gpus)
        if key in mappings:
            raise ValueError(f"{path}: [[map]] entry {number}: {mapping.model} with {mapping.gpus} GPUs "
                             "is mapped twice")
        mappings[key] = mapping
    return mappings


def _mapping(entry: object, where: str) -> ModelMapping:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: not a table")
    if unknown := set(entry) - _KEYS:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    if missing := {"model", "gpus", "platform", "why"} - set(entry):
        raise ValueError(f"{where}: missing {sorted(missing)}")
    model, gpus, platform, why = entry["model"], entry["gpus"], entry["platform"], entry["why"]
    if not isinstance(model, str) or not model or not isinstance(why, str) or not why.strip():
        raise ValueError(f"{where}: model and why must be non-empty strings")
    if platform not in PLATFORMS:
        raise ValueError(f"{where}: platform {platform!r} is not one of {sorted(PLATFORMS)}")
    board = len(PLATFORMS[platform].topology().gpus)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= board:
        raise ValueError(f"{where}: gpus must be an integer from 1 to {board} ({platform} has {board})")
    installed = entry.get("installed")
    if installed is None:
        if gpus != board:
            raise ValueError(f"{where}: {platform} has {board} GPUs, not {gpus}: say which are installed")
        return ModelMapping(model, gpus, platform, None, why)
    if (not isinstance(installed, list) or len(installed) != gpus or len(set(installed)) != gpus
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < board for i in installed)):
        raise ValueError(f"{where}: installed must list {gpus} distinct GPU indices of {platform} (0 to {board - 1})")
    return ModelMapping(model, gpus, platform, tuple(sorted(installed)), why)


def alibaba_fleet(gpu_model_map: Path = GPU_MODEL_MAP, nodes: Path = DATA / NODES,
                  scale: float = 1.0) -> tuple[ClusterNode, ...]:
    """The 1,213 GPU nodes of the trace, each the board its (model, GPU count) maps to; the pool is the model.

    `scale` below 1 keeps round(count * scale) nodes, at least one, of each (model, GPU count) group, the first
    in file order, so the model proportions hold: the whole fleet at high load needs ~200,000 synthetic jobs to
    reach steady state, one node in ten reaches it with a tenth of them."""
    if not 0 < scale <= 1:
        raise ValueError(f"the fleet scale must be more than 0 and at most 1, not {scale}")
    mappings = load_gpu_model_map(gpu_model_map)
    rows: list[tuple[tuple[str, int], ClusterNode]] = []
    with open(nodes, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            key = (row["model"], int(row["gpu"]))
            if key not in mappings:
                raise ValueError(f"{gpu_model_map}: no entry for {key[0]} with {key[1]} GPUs (node {row['sn']})")
            mapping = mappings[key]
            rows.append((key, ClusterNode(row["sn"], mapping.platform, mapping.model, mapping.installed)))
    keep = {key: max(1, round(count * scale)) for key, count in Counter(key for key, _ in rows).items()}
    seen: Counter[tuple[str, int]] = Counter()
    fleet: list[ClusterNode] = []
    for key, node in rows:
        seen[key] += 1
        if seen[key] <= keep[key]:
            fleet.append(node)
    return tuple(fleet)


def installed_gpus(node: ClusterNode) -> tuple[int, ...]:
    """The board GPUs the node has: the one place that reads `installed` against the platform."""
    if node.installed is not None:
        return node.installed
    return tuple(range(len(PLATFORMS[node.platform].topology().gpus)))


def pool_capacity(cluster: Sequence[ClusterNode]) -> Mapping[str, int]:
    """GPUs per pool label."""
    capacity: dict[str, int] = {}
    for node in cluster:
        capacity[node.gpu_model] = capacity.get(node.gpu_model, 0) + len(installed_gpus(node))
    return capacity


def largest_node(cluster: Sequence[ClusterNode]) -> Mapping[str, int]:
    """The most GPUs one node of each pool has: a pod larger than that can never run in the pool."""
    largest: dict[str, int] = {}
    for node in cluster:
        largest[node.gpu_model] = max(largest.get(node.gpu_model, 0), len(installed_gpus(node)))
    return largest
