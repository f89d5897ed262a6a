"""Prometheus metrics, in a registry of their own so that several apps (tests, demo) can coexist."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Sized

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.cache.cluster_state import ClusterState
from extender.cache.dra_crosscheck import GRACE_SECONDS
from extender.cache.dra_inventory import NodeClass
from extender.verbs.drains import Drains
from topology.sharing import Sharing
from topology.version import version

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_GBPS_BUCKETS = (5, 10, 20, 50, 100, 150, 200, 300, 450, 600, 900)


class Metrics:
    def __init__(self, state: ClusterState, plans: Sized, leading: Callable[[], bool] = lambda: True,
                 drains: Drains | None = None) -> None:
        self.registry = CollectorRegistry()
        Gauge("gpu_topology_extender_build_info", "Always 1: the extender's version and its Python's",
              ["version", "python"], registry=self.registry).labels(version(), platform.python_version()).set(1)
        self.request_seconds = Histogram("gpu_topology_extender_request_seconds", "Time to answer a verb, server side",
                                         ["verb"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.decisions = Counter("gpu_topology_extender_decisions_total", "Outcomes per verb",
                                 ["verb", "outcome"], registry=self.registry)
        self._decided: dict[tuple[str, str], Counter] = {}  # decisions' children, of a fixed set of verbs and outcomes
        self.ring_gbps = Histogram("gpu_topology_extender_granted_ring_gbps",
                                   "Ring bandwidth of the GPU sets granted at bind (multi-GPU pods)",
                                   buckets=_GBPS_BUCKETS, registry=self.registry)
        self.requests_refused = Counter("gpu_topology_extender_requests_refused_total",
                                        "Requests refused at the HTTP edge, by verb (or connection) and reason: "
                                        "too_large, not_json, bad_shape, timeout, head_too_large, client_name, "
                                        "http2_protocol, http2_resets",
                                        ["verb", "reason"], registry=self.registry)
        self.connections = Counter("gpu_topology_extender_connections_opened_total",
                                   "Connections accepted. Each costs a TLS handshake; kube-scheduler keeps 2 idle "
                                   "connections to an extender, so one per request means it opens more than it keeps",
                                   registry=self.registry)
        self.mismatches = Counter("gpu_topology_extender_allocation_mismatches_total",
                                  "Pods the kubelet gave other GPUs than they were bound to (the ledger followed it)",
                                  ["node"], registry=self.registry)
        self.dra_mispredicted = Counter(
            "gpu_topology_extender_dra_mispredicted_total",
            "Pods bound to a DRA node whose claims kube-scheduler's allocator gave other GPUs than the first fit the "
            "extender judged the node by (its in-flight allocations, which the extender cannot see, or a changed "
            "allocator)", ["node"], registry=self.registry)
        ledger = Gauge("gpu_topology_extender_ledger_pods",
                       "Entries holding GPUs in the ledger: pods, and the open slots of group plans",
                       registry=self.registry)
        ledger.set_function(lambda: len(state.ledger))
        planned = Gauge("gpu_topology_extender_group_plans", "Group plans in force (extender/groups/plans.py)",
                        registry=self.registry)
        planned.set_function(lambda: len(plans))
        if drains is not None:
            draining = Gauge("gpu_topology_extender_drains", "Drains in force: free GPUs held back for a waiting "
                             "pod or, past its age bound, a waiting group (extender/verbs/drains.py)",
                             registry=self.registry)
            draining.set_function(lambda: len(drains))
            self.registry.register(_DrainsStarted(drains))
        doubtful = Gauge("gpu_topology_extender_nodes_domain_refused",
                         "Nodes whose NVLink domain was refused (fabric not complete, GPUs or sources disagreeing)",
                         registry=self.registry)
        doubtful.set_function(lambda: sum(1 for view in list(state.views().values()) if view.domain.problem))
        stale = Gauge("gpu_topology_extender_stale_nodes", "Nodes whose GPU state is older than the bound",
                      registry=self.registry)
        stale.set_function(state.stale_count)
        nodes = Gauge("gpu_topology_extender_nodes", "Nodes with a usable GPU topology", registry=self.registry)
        nodes.set_function(lambda: sum(1 for view in state.views().values() if view.compiled is not None))
        leader = Gauge("gpu_topology_extender_leader", "1 while this replica leads (always, without leader election)",
                       registry=self.registry)
        leader.set_function(lambda: 1 if leading() else 0)
        self.registry.register(_RefusedNodes(state))
        self.registry.register(_SharedNodes(state))
        self.registry.register(_DraNodes(state))

    def decision(self, verb: str, outcome: str) -> Counter:
        """decisions_total's child for a verb's outcome, looked up once: filter and bind count a few each pod."""
        child = self._decided.get((verb, outcome))
        if child is None:
            child = self._decided[verb, outcome] = self.decisions.labels(verb, outcome)
        return child


class _RefusedNodes(Collector):
    """gpu_topology_extender_nodes_refused{reason}: read from the node views at each scrape, so it is never stale."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("gpu_topology_extender_nodes_refused",
                                   "Nodes whose GPU annotation was refused, by reason", labels=["reason"])
        for reason, count in self._state.refused_counts().items():
            family.add_metric([reason], count)
        yield family


class _DraNodes(Collector):
    """Nodes by where their GPUs come from (extender/cache/dra_inventory.py), the GPUs DRA nodes have free as the
    extender counts them, the DRA objects it refused or could not place, and the GPUs node agents report held that no
    claim holds (extender/cache/dra_crosscheck.py), read at each scrape."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        inventory = self._state.dra
        views = list(self._state.views().values())
        counts = dict.fromkeys(NodeClass, 0)
        free = 0
        for view in views:
            found = inventory.node_class(view.name)
            counts[found] += 1
            if found is NodeClass.DRA_GPU:
                free += view.free.bit_count()
        family = GaugeMetricFamily("gpu_topology_extender_nodes_by_class",
                                   "GPU nodes by who hands out their GPUs: the device plugin, a DRA driver, or the "
                                   "device plugin beside a ComputeDomain driver", labels=["class"])
        for node_class, count in counts.items():
            family.add_metric([node_class.value], count)
        yield family
        yield GaugeMetricFamily("gpu_topology_extender_dra_free_gpus",
                                "Free GPUs of the DRA nodes, as their ResourceClaims and the ledger leave them",
                                value=free)
        yield GaugeMetricFamily("gpu_topology_extender_dra_refused_objects",
                                "ResourceSlices and ResourceClaims refused as outside what kube-apiserver admits",
                                value=len(inventory.refused))
        yield GaugeMetricFamily("gpu_topology_extender_dra_unknown_devices",
                                "Devices allocated by a claim that no complete ResourceSlice pool publishes",
                                value=inventory.unknown_devices())
        yield GaugeMetricFamily("gpu_topology_extender_dra_unclaimed_gpus",
                                f"GPUs of DRA nodes that the node agent has reported held for {GRACE_SECONDS:g} s or "
                                "more while no allocated ResourceClaim holds them; they are kept taken",
                                value=sum(len(gpus) for gpus in self._state.dra_unclaimed().values()))
        yield CounterMetricFamily("gpu_topology_extender_dra_unclaimed_found",
                                  "GPUs found held by the node agent's report and by no allocated ResourceClaim, for "
                                  f"{GRACE_SECONDS:g} s or more (each counted once a spell)",
                                  value=self._state.claim_check.found)


class _SharedNodes(Collector):
    """gpu_topology_extender_nodes_shared{mode}: nodes placed by count alone because they share their GPUs
    (topology/sharing.py), every mode listed, zero where none."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("gpu_topology_extender_nodes_shared",
                                   "Nodes whose GPUs are shared (time-slicing, MPS, MIG), by mode", labels=["mode"])
        counts = dict.fromkeys((mode for mode in Sharing if mode.shared), 0)
        for view in list(self._state.views().values()):
            if view.sharing.shared:
                counts[view.sharing] += 1
        for mode, count in counts.items():
            family.add_metric([mode.value], count)
        yield family


class _DrainsStarted(Collector):
    """Drains begun, counted by the drains themselves (a count kept where it changes, read at scrape)."""

    def __init__(self, drains: Drains) -> None:
        self._drains = drains

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("gpu_topology_extender_drains_started", "Drains begun since the extender started",
                                  value=self._drains.started)
