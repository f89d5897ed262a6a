"""The planner: makes the claims the admission webhook named (admission.py), pinned to the GPUs the extender chose
(choice.py), so that kube-scheduler, the one writer of `status.allocation`, allocates exactly those.

A pod waits, held by kube-scheduler's DRA plugin, until its claims exist. The planner judges the DRA nodes the
pod could go to (node selector, taints, cordon, required node affinity: what a planner before the scheduler can
check; anything else it cannot, and the pin timeout covers), chooses one node and set for all of the pod's
pinnable claims, and creates each claim as the resourceclaim controller would (the template's spec, owned by the
pod, so it goes with it) plus a selector naming its share of the set by UUID. Until allocated, the pinned GPUs
are held in the inventory against every other pod (DraInventory.taken).

Races end in a replan, never in a GPU given twice: kube-scheduler allocates a pinned claim only if its GPUs are
free in its own cycle. When another pod's allocation takes a pinned GPU, or the claim is not allocated within
`timeout` (the node failed a check the planner could not make), the planner deletes the claim, on the
resourceVersion it made (a claim allocated meanwhile changed it, and the delete fails), and plans again without
that node. After MAX_ATTEMPTS it makes the claim unpinned, as the template says: the pod is placed as without
the planner.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.api.dra import pin_selector
from extender.cache.cluster_state import ClusterState
from extender.pinning.choice import choose_pin
from extender.pinning.node_fit import NodeFacts, PodPlacementRules, parse_node, parse_rules
from topology import bounds
from topology.annotations import AnnotationKeys
from topology.select import Selector

log = logging.getLogger(__name__)

PIN_TIMEOUT_SECONDS = 30.0
MAX_ATTEMPTS = 3
MAX_AWAITING = 10_000
POD_CLAIM_ANNOTATION = "resource.kubernetes.io/pod-claim-name"  # what the resourceclaim controller writes too


class ClaimApi(Protocol):
    """The API server, as the planner writes to it (`extender.kube.client.KubernetesApi`)."""

    def create_resource_claim(self, namespace: str, claim: Mapping[str, Any]) -> dict: ...

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None: ...


@dataclass(frozen=True, slots=True)
class PodClaim:
    name: str  # spec.resourceClaims[].name
    claim: str  # the ResourceClaim the webhook named
    template: str


@dataclass(frozen=True, slots=True)
class Awaiting:
    namespace: str
    name: str
    uid: str
    claims: tuple[PodClaim, ...]
    rules: PodPlacementRules


@dataclass(slots=True)
class _Made:
    """The claims the planner made for one pod, until they are allocated."""

    node: str
    gpus: tuple[str, ...]  # sorted: each claim's share is cut from it in the pod's order of claims
    at: float
    claims: dict[str, tuple[str, str]] = field(default_factory=dict)  # claim name -> (uid, resourceVersion)
    attempts: int = 1
    excluded: frozenset[str] = frozenset()
    pinned: bool = True


class PinPlanner:
    def __init__(self, state: ClusterState, selector: Selector, api: ClaimApi, keys: AnnotationKeys,
                 clock: Callable[[], float], timeout: float = PIN_TIMEOUT_SECONDS) -> None:
        self.state, self.selector, self.api, self.keys, self.clock = state, selector, api, keys, clock
        self.timeout = timeout
        self._awaiting: OrderedDict[str, Awaiting] = OrderedDict()  # pod uid -> the pod, in arrival order
        self._nodes: dict[str, NodeFacts] = {}
        self._made: dict[str, _Made] = {}  # pod uid -> what the planner made for it
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {"pinned": 0, "unpinned": 0, "replanned": 0}
        self.on_count: Callable[[str], None] = lambda outcome: None  # the metric (cli.py)
        self.pods = _Feed(self._replace_pods, self._apply_pod)
        self.nodes = _Feed(self._replace_nodes, self._apply_node)

    def run(self, interval: float = 0.2, stop: threading.Event | None = None,
            active: Callable[[], bool] | None = None) -> None:
        """Plan every `interval` seconds while `active` (the leader alone makes claims) until `stop`."""
        stop = stop or threading.Event()
        while not stop.wait(interval):
            if active is not None and not active():
                continue
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the loop outlives one bad round; the next one retries
                log.exception("pin planner round failed")

    def tick(self) -> None:
        with self._lock:
            awaiting = list(self._awaiting.values())
        for pod in awaiting:
            self._step(pod)

    # -- one pod ---------------------------------------------------------------------------------------------

    def _step(self, pod: Awaiting) -> None:
        """Decide under the ledger lock (the inventory and the keys are read there), write to the API without it."""
        with self.state.ledger.lock:
            made, why = self._made.get(pod.uid), self._replan_reason(pod)
        excluded, attempt = frozenset[str](), 1
        if made is not None and why is not None:
            log.info("pod %s/%s: replanning its pinned claims on %s: %s", pod.namespace, pod.name, made.node, why)
            if not self._delete(pod, made):
                return
            self._count("replanned")
            excluded, attempt, made = made.excluded | {made.node}, made.attempts + 1, None
        if made is None:
            with self.state.ledger.lock:
                if attempt == 1 and any(self.state.dra.claim_state(pod.namespace, claim.claim) is not None
                                        for claim in pod.claims):
                    return  # made before this process knew the pod (a replica before it): not replanned here
                made = self._plan(pod, excluded, attempt)
            if made is None:
                return
            self._made[pod.uid] = made
        if len(made.claims) < len(pod.claims):
            with self.state.ledger.lock:
                bodies = self._bodies(pod, made)
            self._create(pod, made, bodies)

    def _count(self, outcome: str) -> None:
        self.counts[outcome] += 1
        self.on_count(outcome)

    def _replan_reason(self, pod: Awaiting) -> str | None:
        """Why the pod's pinned claims must be made again, if they must."""
        made = self._made.get(pod.uid)
        if made is None or not made.pinned or len(made.claims) < len(pod.claims):
            return None
        inventory = self.state.dra
        if all((found := inventory.claim_state(pod.namespace, claim.claim)) is not None and found[1]
               for claim in pod.claims):
            return None  # allocated: the claims' results hold the GPUs now
        if self.state.view(made.node) is None:
            return "its node is gone"
        if inventory.allocated_elsewhere(made.node, made.gpus, {uid for uid, _ in made.claims.values()}):
            return "another claim was given a pinned GPU"
        if self.clock() - made.at > self.timeout:
            return f"not allocated within {self.timeout:g} s"
        return None

    def _delete(self, pod: Awaiting, made: _Made) -> bool:
        """Delete the claims made, each at the version made: False if one was allocated (or changed) meanwhile."""
        for name, (uid, version) in list(made.claims.items()):
            try:
                self.api.delete_resource_claim(pod.namespace, name, uid, version)
            except Exception as error:  # noqa: BLE001 - allocated meanwhile (409), gone (404), or the API is down
                log.info("pod %s/%s: claim %s kept: %s", pod.namespace, pod.name, name, error)
                return False
            del made.claims[name]
        return True

    def _plan(self, pod: Awaiting, excluded: frozenset[str], attempt: int) -> _Made | None:
        """The node and set for all the pod's claims; unpinned after MAX_ATTEMPTS; None to wait for GPUs."""
        inventory = self.state.dra
        templates = [inventory.template(pod.namespace, claim.template) for claim in pod.claims]
        if any(template is None or not inventory.whole_gpus(template) for template in templates):
            return None  # a template not seen yet (or no longer pinnable): asked again next round
        count = sum(inventory.whole_gpus(template) for template in templates if template is not None)
        candidates = [name for name, facts in self._nodes.items() if name not in excluded and pod.rules.allow(facts)]
        choice = choose_pin(self.state, self.selector, count, candidates) if attempt <= MAX_ATTEMPTS else None
        if choice is None and attempt <= MAX_ATTEMPTS and not excluded:
            return None  # no DRA node has the GPUs free now: asked again next round, as kube-scheduler would wait
        pinned = choice is not None and inventory.gpu_driver(choice.node) is not None
        return _Made(choice.node if choice is not None else "", tuple(sorted(choice.gpus)) if pinned and choice else (),
                     self.clock(), attempts=attempt, excluded=excluded, pinned=pinned)

    def _bodies(self, pod: Awaiting, made: _Made) -> list[dict[str, Any]]:
        """The claims still to make: each the template's spec, its requests pinned to their share of the set."""
        inventory = self.state.dra
        share = list(made.gpus)
        driver = inventory.gpu_driver(made.node)
        bodies = []
        for claim in pod.claims:
            template = inventory.template(pod.namespace, claim.template)
            if template is None:
                return bodies  # deleted meanwhile: the rest is asked again next round
            spec = copy.deepcopy(template.spec)
            for request in spec["devices"]["requests"] if made.pinned and driver is not None else ():
                count = request["exactly"].get("count", 1)
                take, share = share[:count], share[count:]
                request["exactly"]["selectors"] = [*(request["exactly"].get("selectors") or []),
                                                   pin_selector(driver, take)]
            if claim.claim not in made.claims:
                bodies.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                               "metadata": {"name": claim.claim, "namespace": pod.namespace,
                                            "annotations": {POD_CLAIM_ANNOTATION: claim.name},
                                            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name,
                                                                 "uid": pod.uid, "controller": True}]},
                               "spec": spec})
        return bodies

    def _create(self, pod: Awaiting, made: _Made, bodies: list[dict[str, Any]]) -> None:
        for body in bodies:
            name = body["metadata"]["name"]
            try:
                created = self.api.create_resource_claim(pod.namespace, body)
            except Exception as error:  # noqa: BLE001 - retried next round
                log.info("pod %s/%s: claim %s not made: %s", pod.namespace, pod.name, name, error)
                return
            meta = created.get("metadata") or {}
            made.claims[name] = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
            with self.state.ledger.lock:  # held at once, as the watch will tell: the next pod planned sees it taken
                if self.state.dra.claim_state(pod.namespace, name) is None:
                    self.state.dra.apply_claim("ADDED", created)
        if len(made.claims) == len(pod.claims):
            self._count("pinned" if made.pinned else "unpinned")
            log.info("pod %s/%s: claims made%s", pod.namespace, pod.name,
                     f", pinned to {','.join(made.gpus)} on {made.node}" if made.pinned else ", unpinned")

    # -- the watches ---------------------------------------------------------------------------------------

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._awaiting.clear()
        for item in items:
            self._apply_pod("ADDED", item)
        with self._lock:
            for uid in set(self._made) - set(self._awaiting):
                del self._made[uid]

    def _apply_pod(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") if isinstance(pod, dict) else None
        if not isinstance(metadata, dict):
            return
        uid = str(metadata.get("uid") or "")
        found = None if kind == "DELETED" else self._awaiting_pod(pod)
        with self._lock:
            if found is None:
                self._awaiting.pop(uid, None)
                self._made.pop(uid, None)
            elif uid in self._awaiting or len(self._awaiting) < MAX_AWAITING:
                self._awaiting[uid] = found

    def _awaiting_pod(self, pod: dict[str, Any]) -> Awaiting | None:
        """The pod, if it waits for claims the planner makes: not bound, not finished, named by the webhook."""
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        annotations = metadata.get("annotations") or {}
        text = annotations.get(self.keys.claim_templates) if isinstance(annotations, dict) else None
        if (not isinstance(text, str) or len(text) > bounds.MAX_PIN_EXPRESSION or not isinstance(spec, dict)
                or spec.get("nodeName") or metadata.get("deletionTimestamp")
                or (pod.get("status") or {}).get("phase") not in (None, "Pending")):
            return None
        named = {claim.get("name"): claim.get("resourceClaimName") for claim in spec.get("resourceClaims") or []
                 if isinstance(claim, dict)}
        claims = []
        for pair in text.split(",")[:bounds.MAX_POD_CLAIMS]:
            name, _, template = pair.partition("=")
            claim = named.get(name)
            if isinstance(claim, str) and template:
                claims.append(PodClaim(name, claim, template))
        if not claims:
            return None
        return Awaiting(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""),
                        str(metadata.get("uid") or ""), tuple(claims), parse_rules(spec))

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        nodes = {}
        for item in items:
            found = parse_node(item)
            if found is not None:
                nodes[found[0]] = found[1]
        self._nodes = nodes

    def _apply_node(self, kind: str, node: dict[str, Any]) -> None:
        found = parse_node(node)
        if found is None:
            return
        if kind == "DELETED":
            self._nodes.pop(found[0], None)
        else:
            self._nodes[found[0]] = found[1]


class _Feed:
    """One watch's reflector sink (replace, apply, synced), fed beside the cluster state's."""

    def __init__(self, replace: Callable[[list[dict[str, Any]]], None],
                 apply: Callable[[str, dict[str, Any]], None]) -> None:
        self.replace, self.apply = replace, apply

    def synced(self) -> None:
        """The planner answers nothing, so it waits for no list."""
