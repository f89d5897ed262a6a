"""What `kubectl gputopo` reads, through the API server only: Nodes, Pods and a pod's Events, and the cluster
state the extender would build from them.

The state is the extender's own (extender/cache/cluster_state.py) fed the listed objects, so a node is stale,
refused or free here exactly as the extender judges it. One difference: the plugin holds no seal key (it is the
extender's Secret), so a pod's sealed bind record is taken as the extender's without checking the seal. The plugin
decides nothing; it shows what pods were bound to.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes import config as k8s_config

from extender.cache.cluster_state import ClusterState
from extender.cache.seal import MIN_KEY_BYTES, VERSION, Seal
from extender.groups.plans import GroupPlans
from extender.kube.client import ACTIVE_PODS, KubeError, KubernetesApi
from topology.annotations import AnnotationKeys

STALE_AFTER_SECONDS = 120.0  # the extender's --stale-after default
DEFAULT_NAMESPACE = "default"


class NotFound(KubeError):
    """The node or pod asked for does not exist."""


class _SealedAsWritten(Seal):
    """Takes every sealed bind record as the extender's: without the key a reader can only tell sealed from not."""

    def __init__(self) -> None:
        super().__init__(bytes(MIN_KEY_BYTES))

    def verify(self, seal: object, uid: str, node: str, gpus: str, containers: str) -> bool:
        return isinstance(seal, str) and seal.startswith(VERSION + ".")


class PluginApi(KubernetesApi):
    """The extender's client, with the reads only the plugin makes: one node, the pods of one node, a pod's
    Events."""

    @property
    def host(self) -> str:
        return str(self._core.api_client.configuration.host)

    def get_node(self, name: str) -> dict:
        return self._found(f"node {name}", lambda: self._object(f"get node {name}", "Node", self._core.read_node,
                                                                  name))

    def find_pod(self, namespace: str, name: str) -> dict:
        return self._found(f"pod {namespace}/{name}", lambda: self.get_pod(namespace, name))

    def list_pods_on(self, node: str) -> list[dict]:
        """The pods bound to one node that are not finished."""
        items, _ = self._list(f"list pods on {node}", self._core.list_pod_for_all_namespaces,
                              field_selector=f"{ACTIVE_PODS},spec.nodeName={node}")
        return items

    def list_pod_events(self, namespace: str, name: str) -> list[dict]:
        """The Events about one pod, oldest first."""
        items, _ = self._list(f"list events of pod {namespace}/{name}", self._core.list_namespaced_event,
                              namespace=namespace,
                              field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}")
        return sorted(items, key=_event_time)

    @staticmethod
    def _found(what: str, read: Callable[[], dict]) -> dict:
        try:
            return read()
        except KubeError as error:
            if error.status == 404:
                raise NotFound(f"{what} not found", 404) from None
            raise


@dataclass(frozen=True, slots=True)
class Connection:
    """kubectl's connection flags."""

    kubeconfig: str | None = None
    context: str | None = None
    namespace: str | None = None
    request_timeout: float = 30.0

    def open(self) -> tuple[PluginApi, str]:
        """The client, and the namespace a pod name is looked up in: -n, else the context's, else default."""
        api = PluginApi.from_kubeconfig(self.kubeconfig, self.context, timeout=self.request_timeout,
                                        list_timeout=self.request_timeout, instance="kubectl-gputopo")
        return api, self.namespace or self._context_namespace() or DEFAULT_NAMESPACE

    def _context_namespace(self) -> str | None:
        try:
            contexts, current = k8s_config.list_kube_config_contexts(self.kubeconfig)
        except (k8s_config.ConfigException, OSError, ValueError):
            return None
        chosen = next((c for c in contexts if c.get("name") == self.context), None) if self.context else current
        return ((chosen or {}).get("context") or {}).get("namespace")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The listed objects and the extender's state built from them, all judged at one instant."""

    state: ClusterState
    nodes: Mapping[str, dict[str, Any]]
    pods: Sequence[dict[str, Any]]
    now: float
    events: Sequence[dict[str, Any]] = field(default_factory=tuple)

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        return [pod for pod in self.pods if (pod.get("spec") or {}).get("nodeName") == node]


@dataclass(frozen=True, slots=True)
class Settings:
    """What the extender was configured with, where it changes what the plugin shows."""

    keys: AnnotationKeys = AnnotationKeys()
    resource: str = "nvidia.com/gpu"
    stale_after: float = STALE_AFTER_SECONDS


def snapshot(nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]], settings: Settings,
             now: float | None = None, events: Sequence[dict[str, Any]] = (),
             dra: tuple[Sequence[dict[str, Any]], Sequence[dict[str, Any]]] = ((), ())) -> Snapshot:
    """The extender's view of these objects: nodes first (a bind record is read against its node), then DRA's
    ResourceSlices and ResourceClaims (`dra`), then pods."""
    moment = time.time() if now is None else now
    state = ClusterState(settings.keys, settings.resource, settings.stale_after, clock=lambda: moment,
                         seal=_SealedAsWritten())
    GroupPlans(state)  # members' sealed plans are read back, and their open slots held, as the extender does
    state.nodes.replace(list(nodes))
    state.nodes.synced()
    state.slices.replace(list(dra[0]))
    state.claims.replace(list(dra[1]))
    state.pods.replace(list(pods))
    state.pods.synced()
    by_name = {str((node.get("metadata") or {}).get("name") or ""): node for node in nodes}
    return Snapshot(state, by_name, tuple(pods), moment, tuple(events))


def read_cluster(api: PluginApi, settings: Settings) -> Snapshot:
    nodes, _ = api.list_nodes()
    pods, _ = api.list_pods()
    return snapshot(nodes, pods, settings, dra=read_dra(api))


def read_node(api: PluginApi, name: str, settings: Settings) -> Snapshot:
    return snapshot([api.get_node(name)], api.list_pods_on(name), settings, dra=read_dra(api))


def read_dra(api: PluginApi) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """ResourceSlices and ResourceClaims; none where the API server serves no resource.k8s.io/v1 (before 1.34)."""
    try:
        return api.list_resource_slices()[0], api.list_resource_claims()[0]
    except KubeError as error:
        if error.status != 404:
            raise
        return [], []


def read_pod(api: PluginApi, namespace: str, name: str, settings: Settings) -> tuple[dict[str, Any], Snapshot]:
    """The pod and what it needs around it: its node when bound, every node when it waits (the closest ones),
    and every pod (the ledger, and the members of its group)."""
    pod = api.find_pod(namespace, name)
    events = api.list_pod_events(namespace, name)
    node = (pod.get("spec") or {}).get("nodeName")
    nodes = [api.get_node(node)] if node else api.list_nodes()[0]
    pods, _ = api.list_pods()
    return pod, snapshot(nodes, pods, settings, events=events, dra=read_dra(api))


def _event_time(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               (event.get("metadata") or {}).get("creationTimestamp") or "")
