"""`make demo`'s DRA part (extender/demo/dra.py): through the extender's HTTP server, with kube-scheduler's DRA
allocator (first fit in slice order) writing each pod's claim before the extender's bind."""

from __future__ import annotations

import re

from extender.demo.dra import GPUS, PODS, run_dra_demo


def test_with_the_extender_every_pod_gets_an_nvlink_pair_where_dra_alone_crosses_sockets() -> None:
    lines: list[str] = []
    run_dra_demo(lines.append)
    table = lines[1].splitlines()[1:]
    assert len(table) == PODS
    rows = [re.findall(r"(a6000-dra-\d) GPUs ([\d,]+) \((\d+) GB/s ring\)", line) for line in table]
    ours = [found[0] for found in rows]
    alone = [found[1] for found in rows]
    assert {node for node, _, _ in ours} == {"a6000-dra-1"}  # its first fits are pairs
    assert [gpus for _, gpus, _ in ours] == ["4,5", "0,1", "2,3", "6,7"]
    assert {ring for _, _, ring in ours} == {"56"}
    assert [gpus for _, gpus, _ in alone][:3] == ["0,5", "1,2", "3,4"]  # a6000-dra-0's first fits cross
    assert sum(int(ring) for _, _, ring in alone) < sum(int(ring) for _, _, ring in ours)
    assert all(len(gpus.split(",")) == GPUS for _, gpus, _ in ours + alone)
