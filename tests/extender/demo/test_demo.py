"""The main job: the demo drives real HTTP and must show NVLink rings where count-only placement loses them."""

from __future__ import annotations

import re

from extender.cli import main


def test_demo_places_multi_gpu_pods_on_nvlink_rings_where_count_only_does_not(capsys) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    decisions = [line for line in out.splitlines() if line.startswith("job-")]
    assert len(decisions) == 48
    assert all("->" in line or "pending" in line for line in decisions)
    placed_lines = [line for line in decisions if "->" in line]
    assert placed_lines and all(" delivered " in line for line in placed_lines), "the kubelet gave what was chosen"
    exact = re.search(r"exactly as chosen \(node agent's device plugin\): (\d+)/(\d+) pods", out)
    assert exact and exact.group(1) == exact.group(2) == str(len(placed_lines))
    rows = {}
    for line in out.splitlines():
        match = re.match(r"(topology-aware|count-only).*?\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+([\d.]+)$", line)
        if match:
            rows[match.group(1)] = [float(value) for value in match.groups()[1:]]
    ours, count_only = rows["topology-aware"], rows["count-only"]
    placed, _, on_nvlink, multi, mean_ring, big_ring = ours
    assert on_nvlink == multi > 0, "every multi-GPU pod the extender placed runs on an NVLink ring"
    assert count_only[2] < count_only[3], "count-only placement loses NVLink rings"
    assert mean_ring > count_only[4] and big_ring > count_only[5]
    assert placed >= count_only[0]
