"""A node's free mask is kept as the ledger changes, not recomputed on every read; and some changes skip the
recomputation (a bind's BINDING entry turned BOUND). Whatever the sequence of reservations, phase changes,
releases and the kubelet's reports, each node's mask is what a full recomputation from the ledger gives."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

from hypothesis import example, given, settings
from hypothesis import strategies as st

from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Assignment, Phase
from extender.demo.cluster import DemoCluster
from topology.codec import NodeState, encode_state

NODES = (("n1", "dgx-h100"), ("n2", "dgx-a100"))
PODS = [f"uid-{i}" for i in range(6)]

step = st.one_of(
    st.tuples(st.just("reserve"), st.sampled_from(PODS), st.sampled_from([name for name, _ in NODES]),
              st.sets(st.integers(0, 7), min_size=1, max_size=4), st.sampled_from([Phase.BINDING, Phase.PLANNED])),
    st.tuples(st.just("phase"), st.sampled_from(PODS),
              st.sampled_from([Phase.BOUND, Phase.UNCERTAIN, Phase.ALLOCATED, Phase.BINDING])),
    st.tuples(st.just("release"), st.sampled_from(PODS), st.booleans()),
    st.tuples(st.just("report"), st.sampled_from([name for name, _ in NODES]), st.booleans()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=30))
# Two pods on one GPU (a clash), both reported; one ends after the report, which releases the GPU; the other's
# entry is then written again (the kubelet confirms it once more): that clears the release, so the GPU is taken
# again by the report's count.
@example([("reserve", "uid-0", "n1", {0}, Phase.BINDING), ("reserve", "uid-1", "n1", {0}, Phase.BINDING),
          ("report", "n1", True), ("release", "uid-0", True), ("phase", "uid-1", Phase.ALLOCATED)])
def test_every_nodes_free_mask_is_what_the_ledger_gives(steps: list[tuple]) -> None:
    state = ClusterState()
    cluster = DemoCluster(state, NODES)
    clock = [1000.0]
    state.ledger.clock = lambda: clock[0]
    for action, *args in steps:
        clock[0] += 1.0
        if action == "reserve":
            uid, node, indices, phase = args
            ids = [gpu.uuid for gpu in cluster.topologies[node].gpus]
            gpus = frozenset(ids[i] for i in indices)
            state.ledger.record(Assignment(uid, f"default/{uid}", node, gpus, clock[0], phase))
        elif action == "phase":
            uid, phase = args
            entry = state.ledger.get(uid)
            if entry is not None:
                state.ledger.record(replace(entry, phase=phase))
        elif action == "release":
            uid, freed = args
            state.ledger.release(uid, freed=freed)
        else:
            node, everything = args
            _report(state, cluster, node, clock[0], everything)
        for name, _ in NODES:
            view = state.view(name)
            assert view is not None and view.compiled is not None
            expected = view.compiled.full_mask & ~state.ledger.taken(view) & ~view.unhealthy
            assert view.free == expected, f"{name} after {action} {args}"


def _report(state: ClusterState, cluster: DemoCluster, node: str, at: float, everything: bool) -> None:
    """The node agent's report: the pods the ledger has on the node, all of them or the first only."""
    entries = sorted(state.ledger.entries(node), key=lambda entry: entry.pod_uid)
    if not everything:
        entries = entries[:1]
    held = {entry.pod_key: entry.gpus for entry in entries if entry.phase is not Phase.PLANNED}
    raw = next(raw for raw in cluster.list_nodes()[0] if raw["metadata"]["name"] == node)
    report = NodeState(frozenset().union(*held.values()), frozenset(), datetime.fromtimestamp(at, timezone.utc),
                       int(at), held)
    raw["metadata"]["annotations"]["gpu-topology.io/state"] = encode_state(report)
    state.nodes.apply("MODIFIED", raw)
