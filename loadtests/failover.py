"""Failover time with the production timings: two `gpu-topology-extender serve --leader-elect` processes
against the in-process API server, the leader stopped each round, and the time until the other carries the
leader label (the Service routes to it) and binds.

Two ways to stop: SIGKILL (a crash or a lost node: the successor waits for the Lease to expire, 15 s after it
last saw it renewed) and SIGTERM (a rolling update: the leader hands the Lease back). Each round also checks
that no GPU is held twice across the switch.

    .venv/bin/python loadtests/failover.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))  # the packages, not tests/'s folders of their names

from helpers.extender_harness import Replica, held_gpus, leader_pods, node_annotations  # noqa: E402
from helpers.kube_api_server import FakeKubeApiServer, make_node, make_pod, wait_until  # noqa: E402

NAMESPACE = "gpu-topology-system"
NODE = "gpu-1"


def one_round(how: signal.Signals, number: int) -> tuple[float, float]:
    """Seconds from the signal to (the label on the standby's Pod, its first bind done)."""
    with FakeKubeApiServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.add_node(make_node(NODE, annotations=node_annotations(NODE)))
        Replica.write_seal_key(Path(tmp))
        first = Replica("a", server, Path(tmp), NAMESPACE)
        second: Replica | None = None
        try:
            wait_until(lambda: leader_pods(server, NAMESPACE) == ["a"], timeout=60, what="a labelled")
            second = Replica("b", server, Path(tmp), NAMESPACE)
            wait_until(lambda: second.get("/readyz")[0] == 200, timeout=60, what="b up and ready as a standby")
            before = server.add_pod(make_pod(f"before-{number}", gpus=4))
            after = server.add_pod(make_pod(f"after-{number}", gpus=4))
            assert first.bind(before, NODE) == ""
            first.process.send_signal(how)
            stopped = time.monotonic()
            first.process.wait(30)
            # After SIGKILL a's label stays (its Pod is not ready, so the Service drops it): wait for b's.
            wait_until(lambda: "b" in leader_pods(server, NAMESPACE), timeout=60, what="b labelled")
            labelled = time.monotonic() - stopped
            assert second.bind(after, NODE) == ""
            bound = time.monotonic() - stopped
            held = held_gpus(server, NODE)
            assert len(held) == len(set(held)) == 8, f"a GPU held twice: {held}"
            return labelled, bound
        finally:
            for replica in (first, second):
                if replica is not None:
                    replica.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    print("failover with lease 15 s, renew deadline 10 s, retry 2 s (client-go's defaults); seconds from the signal")
    for how in (signal.SIGTERM, signal.SIGKILL):
        figures = [one_round(how, number) for number in range(rounds)]
        labelled = [f[0] for f in figures]
        bound = [f[1] for f in figures]
        print(f"{how.name}: label on the new leader median {statistics.median(labelled):.2f} max {max(labelled):.2f}; "
              f"first bind done median {statistics.median(bound):.2f} max {max(bound):.2f} "
              f"({rounds} rounds, no GPU held twice)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
