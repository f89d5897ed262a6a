"""End to end, faults under the real control plane (issue 31, item 4), at a smaller scale than `make faults`: GPU pods
arriving at a real kube-scheduler (v1.36) while two extender replicas with leader election place them, and, once each,
the leading extender SIGKILLed, kube-apiserver restarted (etcd stays) and the extender's watches cut.

It is loadtests/faults.py's run, with its checks as the assertions: every pod bound, no GPU given twice, the
leader's ledger equal to the pods' sealed annotations, no pause longer than the lease plus one retry (the shipped
timings: 15 s + 2 s), no replica that needed a restart, no ERROR line. The windows around the faults set its length
(about three minutes, whatever the scale), so it runs 720 pods on 72 nodes at 4 pods/s, where `make faults` runs
2,000 on 200 at 10 pods/s: the same run on less CPU, on a machine the suite shares.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers.paths import LOADTESTS
from kube_e2e import find_kube_binaries, skip_reason

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

sys.path.insert(0, str(LOADTESTS))

import faults  # noqa: E402
from bench_select import missed  # noqa: E402

ARGS = ["--nodes", "72", "--pods", "720", "--rate", "4"]


def test_every_pod_binds_once_through_a_killed_leader_a_restarted_apiserver_and_cut_watches(tmp_path: Path) -> None:
    assert _BINARIES is not None
    args = faults.parse_args(ARGS)
    outcome = faults.run(args, _BINARIES, tmp_path)
    report = "\n".join(faults.table(outcome) + [check.row() for check in outcome.checks])
    print(report)
    assert [fault.name for fault in outcome.faults] == list(faults.FAULTS)
    assert not missed(outcome.checks), report
