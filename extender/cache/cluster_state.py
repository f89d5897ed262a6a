"""The cluster as the extender sees it: node topologies and GPU occupancy, fed by Node and Pod watches.

Each node is held as an immutable `NodeView` (extender/cache/node_view.py) that already carries its free-GPU
mask, so the hot path (filter and prioritize over thousands of names) is a dictionary look-up per node. Views are
rebuilt only when a node, a pod or the ledger changes. What a watch event means for a reservation is the ledger's
to say (extender/cache/ledger.py): the state tells it, and it keeps the free masks in the views.

Group plans are above the cache: the state knows them only as `MemberPlans`, which `use_plans` attaches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from extender.api._names import lookup
from extender.api.dra import GPU_CLASS, GPU_DRIVER
from extender.api.pod_request import DEFAULT_GPU_RESOURCE, PodRequest, parse_inputs, parse_pod
from extender.api.preferences import soft_taints
from extender.cache.assignments import Assignment, Phase
from extender.cache.domains import DomainIndex
from extender.cache.dra_crosscheck import ClaimCheck
from extender.cache.dra_inventory import DraInventory
from extender.cache.kept_keys import HELD_BACK, KeptKeys
from extender.cache.ledger import BIND_OUTCOME_SECONDS, Ledger, NoClaims, SlotClaims
from extender.cache.node_view import REFUSED, Key, KeyValue, NodeKey, NodeView, SharedKey, allocator_pick
from extender.cache.seal import Seal
from topology.annotations import AnnotationKeys
from topology.assignment import AssignmentError, decode_containers
from topology.codec import CodecError, StateAheadError, check_state, decode_state, decode_topology
from topology.compiled import CompiledTopology, compile_topology
from topology.fabric import CLIQUE_LABEL, reconcile
from topology.sharing import combine, from_labels

log = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


_MAX_INTERNED = 1 << 16
MAX_DEAD_BOARDS = 256  # compiled boards kept by keys of no live node, at most

STALE_RECHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class PodRecord:
    request: PodRequest
    node: str | None
    version: str = ""  # the resourceVersion parsed: the service takes `request` for the pod of that version
    inputs: bytes | None = None  # what the parse read (pod_request.parse_inputs): a version alike is not parsed again


class MemberPlans(SlotClaims, Protocol):
    """The group plans (extender/groups/plans.py), as the watches tell them of their members."""

    def restore(self, group: str, uid: str, node: str, value: object, held: frozenset[str]) -> None: ...

    def forget_member(self, uid: str) -> None: ...


class _NoPlans(NoClaims):
    """Until plans are attached: no member holds a slot, and no sealed plan is read back."""

    def restore(self, group: str, uid: str, node: str, value: object, held: frozenset[str]) -> None:
        """No plan is put in force."""

    def forget_member(self, uid: str) -> None:
        """Nothing is held."""


class ClusterState:
    def __init__(self, keys: AnnotationKeys | None = None, resource: str = DEFAULT_GPU_RESOURCE,
                 stale_after: float = 120.0, clock: Callable[[], float] = time.time, seal: Seal | None = None,
                 bind_outcome_seconds: float = BIND_OUTCOME_SECONDS, levels: Sequence[str] = (),
                 gpu_drivers: Sequence[str] = (GPU_DRIVER,), gpu_classes: Sequence[str] = (GPU_CLASS,)) -> None:
        self.keys = keys or AnnotationKeys()
        self.resource = resource
        self.stale_after = stale_after
        self.seal = seal or Seal.ephemeral()
        self.ledger = Ledger(self, self._placed, clock, bind_outcome_seconds)
        self.domains = DomainIndex(levels, on_whole=self._rekey)
        self.plans: MemberPlans = _NoPlans()
        self.group_members: dict[str, dict[str, str | None]] = {}  # group key -> member UID -> its node
        self.group_sizes: dict[str, int] = {}  # group key -> members, from PodGroup objects (groups/sizes.py)
        self._views: dict[str, NodeView] = {}
        self._keys: dict[str, Key] = {}
        self._names: dict[str, str] = {}  # each node's name as the watch gave it, by itself: `own_names`
        self._held: dict[str, int] = {}  # node -> GPUs held back from every pod but the drain's own
        self._seen_keys: dict[str, Key] = {}  # _keys with the held-back GPUs taken out: what other pods see
        self._interned: dict[KeyValue, NodeKey] = {}
        # Request size -> each DRA node key (with its slice order) -> the key of what its first fit gives for that
        # size, which nodes of other orders share: filter and prioritize decide once per such key.
        self._given: dict[int, dict[NodeKey, NodeKey]] = {}
        # Size -> each node's key as read for that request size: on a DRA node what its first fit gives, so that a
        # request reads its names in one C pass, not one for the keys and one for what they give. Made on the first
        # request of the size once a DRA node is known, kept as keys change, dropped with dead keys.
        self._by_size: dict[int, dict[str, Key]] = {}
        self._kept = KeptKeys(self.ledger.lock)  # the keys of the name lists requests repeat, size by size
        self._interned_boards: set[CompiledTopology] = set()
        self._boards_limit = MAX_DEAD_BOARDS
        self.key_epoch = 0  # bumped when keys are forgotten: memos of answers per key must be emptied
        self.version = 0  # bumped on every change of a node's view: what was worked out from the views is old
        self._observed: dict[str, float] = {}
        self._stale: tuple[float, frozenset[str]] = (float("-inf"), frozenset())  # (when checked, stale names)
        self._pods: dict[str, PodRecord] = {}
        self._synced: set[str] = set()
        self._needed = {"nodes", "pods"}  # what must be listed before the state answers (`ready`)
        self.nodes = _Sink(self, "nodes", self._replace_nodes, self._apply_node)
        self.pods = _Sink(self, "pods", self._replace_pods, self._apply_pod)
        self.dra = DraInventory(gpu_drivers, gpu_classes, on_node=self._dra_changed)
        self.claim_check = ClaimCheck(clock)
        self.slices = _Sink(self, "resourceslices", self._locked(self.dra.replace_slices),
                            self._locked(self.dra.apply_slice))
        self.claims = _Sink(self, "resourceclaims", self._locked(self.dra.replace_claims),
                            self._locked(self.dra.apply_claim))
        self.templates = _Sink(self, "resourceclaimtemplates", self._locked(self.dra.replace_templates),
                               self._locked(self.dra.apply_template))

    @property
    def clock(self) -> Callable[[], float]:
        """The one clock of the cache, the ledger's."""
        return self.ledger.clock

    def use_plans(self, plans: MemberPlans) -> None:
        """Attach the group plans: members' sealed plans are read back into them, and the ledger gives a slot back
        when its member's bind did not happen."""
        self.plans = plans
        self.ledger.claims = plans

    @property
    def ready(self) -> bool:
        return self._needed <= self._synced

    def watch_dra(self) -> None:
        """DRA objects are watched: until both are listed, what DRA nodes have free is unknown."""
        self._needed |= {"resourceslices", "resourceclaims"}

    def view(self, name: str) -> NodeView | None:
        return self._views.get(name)

    def views(self) -> Mapping[str, NodeView]:
        return self._views

    def pod(self, uid: str) -> PodRecord | None:
        return self._pods.get(uid)

    def parsed(self, uid: str, version: str) -> PodRequest | None:
        """The watch's parse of this version of a GPU pod, if it has read that version: kube-scheduler's filter
        carries the pod as the watch delivered it, so the service need not parse it again. Not for a pod with
        ResourceClaims (no `inputs`): its parse also read the claims as they were then, which change apart from it."""
        record = self._pods.get(uid)
        if record is None or record.inputs is None or not version or record.version != version:
            return None
        return record.request

    def keys_for(self, names: list[str]) -> list[Key | None]:
        """Each node's key, None for a node never seen; one C pass (extender/api/_names.c) for thousands of names."""
        return lookup(names, self._keys)

    def keys_given(self, names: list[str], count: int) -> list[Key | None]:
        """Each node's key, a DRA node's as what its first fit gives `count` GPUs: `keys_for` and `given_keys` in
        one C pass; for a name list that requests repeat (api/wire.py RecentNames), a copy of the keys kept for it
        (cache/kept_keys.py)."""
        if self._given.get(count):
            return self._kept_lookup(names, count, self._size_table(count))
        return self._kept_lookup(names, 0, self._keys)

    def _kept_lookup(self, names: list[str], size: int, table: dict[str, Key]) -> list[Key | None]:
        """`names` looked up in `table`, the keys as requests of `size` read them (`_kept_key`); for a list that
        requests repeat, a copy of those kept for it."""
        origin = getattr(names, "origin", None)
        if origin is None:
            return lookup(names, table)
        return self._kept.read(origin, size, lambda listed: lookup(listed, table))

    def _kept_key(self, name: str, size: int) -> Key | None:
        """The node's key as requests of `size` read it: HELD_BACK, with held-back GPUs taken; 0, as it is; else
        as a request of that many GPUs (`keys_given`)."""
        if size == HELD_BACK:
            return self._seen_keys.get(name)
        key = self._keys.get(name)
        return None if key is None else self._key_of_size(key, size)

    def _rekept(self, name: str) -> None:
        """The node's keys changed: so do those kept for the lists that name it."""
        self._kept.changed(name, partial(self._kept_key, name))

    def _size_table(self, count: int) -> dict[str, Key]:
        """Each node's key as a request of `count` GPUs reads it, made on the first such request."""
        table = self._by_size.get(count)
        if table is None:
            with self.ledger.lock:
                table = self._by_size[count] = {name: self._key_of_size(key, count)
                                                for name, key in self._keys.items()}
        return table

    def own_names(self, names: list[str]) -> list[str]:
        """`names` as the very str objects the node tables hold (a name of no node as it is): a lookup of one of
        those in a table finds its entry by identity, reading neither the name's characters nor the table's."""
        return lookup(names, self._names, names)

    def _set_key(self, name: str, key: Key) -> None:
        self._names.setdefault(name, name)
        self._keys[name] = key
        for count, table in self._by_size.items():
            table[name] = self._key_of_size(key, count)

    def _key_of_size(self, key: Key, count: int) -> Key:
        """The key as a request of `count` GPUs reads it (0: as it is)."""
        return self._given.get(count, {}).get(key, key) if count and isinstance(key, NodeKey) else key

    def keys_held_back(self, names: list[str]) -> list[Key | None]:
        """Each node's key as a pod sees it with the held-back GPUs (`hold_back`) not free: one C pass, as
        `keys_for`, whatever the number of nodes holding GPUs back; kept for a list requests repeat, as
        `keys_given`."""
        return self._kept_lookup(names, HELD_BACK, self._seen_keys)

    def hold_back(self, node: str, gpus: int) -> None:
        """Hold these GPUs of the node back from every pod but the one draining them (extender/verbs/drains.py
        says whose they are): `keys_held_back` shows them as taken, those free now and those that free later."""
        with self.ledger.lock:
            if gpus:
                self._held[node] = gpus
            else:
                self._held.pop(node, None)
            if node in self._keys:
                self._seen_keys[node] = self._held_key(node)
                self._rekept(node)
            self.version += 1

    def _held_key(self, node: str) -> Key:
        key = self._keys[node]
        held = self._held.get(node, 0)
        return self.key_without(key, held) if held and isinstance(key, NodeKey) else key

    def is_stale(self, view: NodeView, now: float) -> bool:
        return view.observed is None or now - view.observed > self.stale_after

    def stale_names(self) -> frozenset[str]:
        """Nodes with a topology whose GPU state is too old, recomputed at most once a second."""
        now = self.clock()
        checked, stale = self._stale
        if now - checked < STALE_RECHECK_SECONDS:
            return stale
        oldest = now - self.stale_after
        observed = self._observed
        if not observed or min(observed.values()) >= oldest:
            stale = frozenset()
        else:
            stale = frozenset(name for name, seen in observed.items() if seen < oldest)
        self._stale = (now, stale)
        return stale

    def _restale(self, name: str, *, stale: bool) -> None:
        """Keep the cached stale set right for one node that changed, instead of rescanning every node."""
        checked, names = self._stale
        if (name in names) != stale:
            self._stale = (checked, names | {name} if stale else names - {name})

    def stale_count(self) -> int:
        return len(self.stale_names())

    def refused_counts(self) -> dict[str, int]:
        """Nodes whose annotation was refused, per reason class (every class, zero where none)."""
        counts = dict.fromkeys(REFUSED, 0)
        for view in list(self._views.values()):
            if view.refused is not None:
                counts[view.refused] += 1
        return counts

    def _placed(self, uid: str) -> str | None:
        """Where the watch shows the pod bound."""
        record = self._pods.get(uid)
        return record.node if record is not None else None

    def _replace_nodes(self, items: list[dict[str, Any]]) -> None:
        with self.ledger.lock:
            names = set()
            for item in items:
                names.add(self._apply_node("ADDED", item))
            for gone in set(self._views) - names:
                self._apply_node("DELETED", {"metadata": {"name": gone}})

    def _apply_node(self, kind: str, node: dict[str, Any]) -> str:
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name") or "")
        with self.ledger.lock:
            if kind == "DELETED":
                self._views.pop(name, None)
                self._keys.pop(name, None)
                self._names.pop(name, None)
                for table in self._by_size.values():
                    table.pop(name, None)
                self._seen_keys.pop(name, None)
                self._rekept(name)
                self.domains.remove(name)
                self._observed.pop(name, None)
                self.ledger.forget_node(name)
                self.claim_check.forget(name)
                self._restale(name, stale=False)
                return name
            labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
            view = self._with_dra(self._decode_node(name, metadata.get("annotations") or {}, labels,
                                                    node.get("spec")))
            self.store(view)
            self.domains.update(name, view.domain.name, labels, doubt=view.domain.problem is not None)
            self._restale(name, stale=view.compiled is not None and self.is_stale(view, self.clock()))
            self.ledger.reported(view)
            self._cross_check(view)
        return name

    def _locked(self, change: Callable[..., None]) -> Callable[..., None]:
        def under_lock(*args: Any) -> None:
            with self.ledger.lock:
                change(*args)
        return under_lock

    def _with_dra(self, view: NodeView) -> NodeView:
        """The view with what DRA allocates on the node (extender/cache/dra_inventory.py) taken from it."""
        found = self.dra.occupancy(view.name, view.ids) if view.compiled is not None else None
        if found is None:
            return replace(view, dra_taken=0, dra_pinned=0, dra_pods=frozenset(), dra_order=None) if (
                view.dra_taken or view.dra_pods or view.dra_order is not None) else view
        order = tuple(view.index_of[gpu] for gpu in self.dra.order(view.name) if gpu in view.index_of)
        return replace(view, dra_taken=view.mask(found[0]), dra_pinned=view.mask(found[1]),
                       dra_pods=self.dra.pods_on(view.name), dra_order=order)

    def _dra_changed(self, node: str) -> None:
        """A DRA pool or claim of the node changed (called under the ledger lock)."""
        view = self._views.get(node)
        if view is None:
            return
        current = self._with_dra(view)
        if (current.dra_taken, current.dra_pinned, current.dra_pods, current.dra_order) != (
                view.dra_taken, view.dra_pinned, view.dra_pods, view.dra_order):
            self.store(current)
            self.ledger.refresh(node)
        self._cross_check(current)

    def _cross_check(self, view: NodeView) -> None:
        """On a DRA node with a fresh report, what the kubelet shows held against what its claims hold
        (extender/cache/dra_crosscheck.py); elsewhere nothing is checked."""
        if view.dra_order is None or self.is_stale(view, self.clock()):
            self.claim_check.forget(view.name)
            return
        claimed = frozenset(gpu for consumer in self.dra.pods_on(view.name)
                            for gpu in self.dra.held_by(consumer, view.name))
        self.claim_check.check(view, claimed)

    def dra_unclaimed(self) -> dict[str, frozenset[str]]:
        """DRA nodes whose fresh report has shown GPUs held that no allocated claim holds, for the check's grace or
        more: they stay taken (extender/cache/dra_crosscheck.py)."""
        stale = self.stale_names()
        with self.ledger.lock:
            return {node: gpus for node, gpus in self.claim_check.mismatched().items() if node not in stale}

    def store(self, view: NodeView) -> None:
        """Hold the node's view and its key (the ledger stores a new free mask here)."""
        self._views[view.name] = view
        self.version += 1
        if view.sharing.shared:
            # Its devices are replicas or slices: no free mask of ours means anything there, so it is never stale.
            self._set_key(view.name, SharedKey(view.sharing))
            self._observed.pop(view.name, None)
        elif view.compiled is None:
            self._set_key(view.name, view.problem or "no GPU topology reported")
            self._observed.pop(view.name, None)
        else:
            self._set_key(view.name, self._intern(view.compiled, view.free, view.unhealthy,
                                                  view.name in self.domains.whole, view.dra_order,
                                                  pinned=view.dra_pinned & ~view.free))
            self._observed[view.name] = float("-inf") if view.observed is None else view.observed
        self._seen_keys[view.name] = self._held_key(view.name)
        self._rekept(view.name)
        self.domains.set_busy(view.name, view.compiled is not None and view.free != view.compiled.full_mask)

    def _rekey(self, name: str) -> None:
        """The node's domain became whole, or stopped being whole: its key says so."""
        key = self._keys.get(name)
        if isinstance(key, NodeKey):
            self._set_key(name, self._intern(key.compiled, key.free, key.unhealthy, name in self.domains.whole,
                                             key.order, pinned=key.pinned))
            self._seen_keys[name] = self._held_key(name)
            self._rekept(name)

    def key_without(self, key: NodeKey, gpus: int) -> NodeKey:
        """The key of a node with `gpus` taken out of its free ones, as a pod sees a node that drains GPUs for
        another pod (extender/verbs/drains.py)."""
        if not key.free & gpus:
            return key
        with self.ledger.lock:
            return self._intern(key.compiled, key.free & ~gpus, key.unhealthy, key.whole, key.order,
                                pinned=key.pinned)

    def given_keys(self, count: int) -> dict[NodeKey, NodeKey] | None:
        """For a request of `count` GPUs, each DRA node key -> the key of what its first fit gives; None when no node
        is a DRA node (NodeKey.deliverable)."""
        return self._given.get(count) if self._given else None

    def _intern(self, compiled: CompiledTopology, free: int, unhealthy: int, whole: bool = False,
                order: tuple[int, ...] | None = None, given: int | None = None, pinned: int = 0) -> NodeKey:
        value: KeyValue = (compiled, free, unhealthy, whole, order, given, pinned)
        key = self._interned.get(value)
        if key is not None:
            return key
        if compiled not in self._interned_boards:
            self._interned_boards.add(compiled)
            if len(self._interned) > _MAX_INTERNED or len(self._interned_boards) > self._boards_limit:
                self._forget_dead_keys()
                self._interned_boards.add(compiled)
        key = self._interned[value] = NodeKey(compiled, free, unhealthy, whole, order, given, pinned)
        if order is not None:
            for count in range(1, compiled.size + 1):
                given = allocator_pick(free, pinned, order, count)
                self._given.setdefault(count, {})[key] = self._intern(compiled, free, unhealthy, whole, None, given)
        return key

    def _forget_dead_keys(self) -> None:
        """Keep only the keys of live nodes. A key pins its compiled board (up to ~70 KB for 64 GPUs), so a
        reporter rewriting its topology must not keep boards alive through old keys: at most
        MAX_DEAD_BOARDS boards beyond the live ones stay, and `key_epoch` tells the answer memos to let go."""
        live = [key for keys in (self._keys, self._seen_keys) for key in keys.values() if isinstance(key, NodeKey)]
        alive = set(live)
        # a live DRA key keeps what its first fits give
        live += [given for keys in self._given.values() for key, given in keys.items() if key in alive]
        self._interned = {key.value: key for key in live}
        for keys in self._given.values():
            for key in [key for key in keys if key.value not in self._interned]:
                del keys[key]
        self._interned_boards = {key.compiled for key in live}
        self._boards_limit = len(self._interned_boards) + MAX_DEAD_BOARDS
        self._by_size.clear()
        self._kept.clear()
        self.key_epoch += 1

    def _decode_node(self, name: str, annotations: Mapping[str, Any], labels: Mapping[str, Any],
                     spec: Any) -> NodeView:
        view = self._decode_annotations(name, annotations)
        sharing = combine(from_labels(labels), view.sharing)
        domain = reconcile(view.reported_domain, labels.get(CLIQUE_LABEL))
        previous = self._views.get(name)
        if domain.problem is not None and (previous is None or previous.domain != domain):
            log.warning("node %s: no NVLink domain: %s", name, domain.problem)  # once per change, not per heartbeat
        return replace(view, sharing=sharing, domain=domain, soft_taints=soft_taints(spec))

    def _decode_annotations(self, name: str, annotations: Mapping[str, Any]) -> NodeView:
        raw = annotations.get(self.keys.topology)
        if raw is None:
            return NodeView(name, problem="no GPU topology reported")
        previous = self._views.get(name)
        if previous is not None and previous.raw_topology == raw and previous.compiled is not None:
            # Heartbeats leave the topology as it was: keep what was decoded, only the state is new.
            view = NodeView(name, previous.compiled, previous.ids, previous.index_of,
                            raw_topology=previous.raw_topology,
                            reported_domain=previous.reported_domain)
        else:
            try:
                topology = decode_topology(str(raw))
            except CodecError as error:
                log.warning("node %s: %s", name, error)
                return _refused(name, "topology-invalid", str(raw))
            # Only the compiled board (shared by identical nodes) and the GPU ids are kept per node.
            ids = tuple(gpu.uuid or f"GPU{gpu.index}" for gpu in topology.gpus)
            view = NodeView(name, compile_topology(topology), ids, {gpu: i for i, gpu in enumerate(ids)},
                            raw_topology=str(raw), reported_domain=topology.domain)
        raw_state = annotations.get(self.keys.state)
        if raw_state is None:
            return view
        try:
            state = decode_state(str(raw_state))
            check_state(state, view.ids, self.clock())
        except CodecError as error:
            log.warning("node %s: %s", name, error)
            return _refused(name, "state-future" if isinstance(error, StateAheadError) else "state-invalid",
                            view.raw_topology)
        return replace(view, unhealthy=view.mask(state.unhealthy), reported_used=state.used,
                       reported_pods=state.pods, observed=state.observed.timestamp(), sharing=state.sharing)

    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        with self.ledger.lock:
            seen = set()
            for item in items:
                self._apply_pod("ADDED", item)
                seen.add(str((item.get("metadata") or {}).get("uid") or ""))
            for uid in set(self._pods) - seen:
                self._forget_pod(uid)
            for assignment in self.ledger.pods():
                if assignment.pod_uid not in seen and assignment.phase not in (Phase.BINDING, Phase.PLANNED):
                    self.ledger.release(assignment.pod_uid, freed=True)

    def _apply_pod(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        uid = str(metadata.get("uid") or "")
        phase = (pod.get("status") or {}).get("phase")
        node = (pod.get("spec") or {}).get("nodeName")
        # A terminating pod still holds its GPUs until it is gone, unless it never reached a node.
        if kind == "DELETED" or phase in FINISHED_PHASES or (metadata.get("deletionTimestamp") and not node):
            self._forget_pod(uid)
            return
        previous = self._pods.get(uid)
        inputs = parse_inputs(pod, self.keys) if previous is not None else None
        if previous is not None and inputs is not None and previous.inputs == inputs:
            request = previous.request
        else:
            request = parse_pod(pod, self.keys, self.resource, self.dra)
            if request.gpus == 0:
                return  # not kept, so not fingerprinted: most of a cluster's pods ask no GPU
            if previous is None:
                inputs = parse_inputs(pod, self.keys)
        self._pods[uid] = PodRecord(request, node, str(metadata.get("resourceVersion") or ""), inputs)
        group = request.group_key
        with self.ledger.lock:  # group placement reads the members under it
            if previous is not None and previous.request.group_key not in (None, group):
                self._leave_group(previous.request.group_key, uid)  # its annotations were edited
            if group is not None:
                self.group_members.setdefault(group, {})[uid] = node
            if not node:
                return
            current = self.ledger.get(uid)
            if current is None:
                annotations = metadata.get("annotations")
                sealed = self._sealed(uid, node, annotations, request)
                if sealed is not None:
                    self.ledger.bound(Assignment(uid, request.key, node, sealed, self.clock(), Phase.BOUND))
                    if group is not None and isinstance(annotations, dict):
                        self.plans.restore(group, uid, node, annotations.get(self.keys.group_plan), sealed)
            elif current.phase in (Phase.BINDING, Phase.UNCERTAIN):
                if current.node == node:  # the watch shows the Binding committed
                    self.ledger.bound(current)
                else:
                    self.ledger.release(uid, freed=False)

    def _sealed(self, uid: str, node: str, annotations: Any, request: PodRequest) -> frozenset[str] | None:
        """The GPUs of a bind record we sealed for this pod on this node, if the annotations are one.

        This is how the ledger comes back after a restart. Anything else a pod carries (no seal, another
        pod's seal, more GPUs than it requests, GPUs the node lacks) is not a record of ours and holds nothing.
        """
        if not isinstance(annotations, dict):
            return None
        gpus, containers = annotations.get(self.keys.gpus), annotations.get(self.keys.containers)
        if not isinstance(gpus, str) or not isinstance(containers, str):
            return None
        if not self.seal.verify(annotations.get(self.keys.seal), uid, node, gpus, containers):
            return None
        held = frozenset(gpus.split(","))
        try:
            parts = decode_containers(containers)
        except AssignmentError:
            return None
        view = self._views.get(node)
        if len(held) > request.gpus or held != frozenset(gpu for _, ids in parts for gpu in ids):
            return None
        if view is not None and not held <= view.index_of.keys():
            return None
        return held

    def _leave_group(self, group: str, uid: str) -> None:
        members = self.group_members.get(group, {})
        members.pop(uid, None)
        if not members:
            self.group_members.pop(group, None)

    def _forget_pod(self, uid: str) -> None:
        record = self._pods.pop(uid, None)
        group = record.request.group_key if record is not None else None
        with self.ledger.lock:
            if group is not None:
                self._leave_group(group, uid)
            self.plans.forget_member(uid)
            self.ledger.release(uid, freed=True)


def _refused(name: str, reason: str, raw_topology: str | None) -> NodeView:
    """A node whose annotation cannot be trusted: no GPU is offered on it, and filter says why."""
    return NodeView(name, problem=REFUSED[reason], refused=reason, raw_topology=raw_topology)


class _Sink:
    """Adapts one resource kind's reflector to the state (the reflector's Sink protocol)."""

    def __init__(self, state: ClusterState, kind: str, replace: Callable[[list[dict[str, Any]]], None],
                 apply: Callable[[str, dict[str, Any]], object]) -> None:
        self._state = state
        self._kind = kind
        self._replace = replace
        self._apply = apply

    def replace(self, items: list[dict[str, Any]]) -> None:
        self._replace(items)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        self._apply(event_type, obj)

    def synced(self) -> None:
        self._state._synced.add(self._kind)
