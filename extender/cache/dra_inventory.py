"""GPUs as DRA publishes and allocates them: which nodes are DRA nodes, and which of their GPUs are taken.

On a node whose GPUs a DRA driver publishes, `node.status.allocatable` has no `nvidia.com/gpu` and a pod's GPUs
are the devices of its ResourceClaims (`status.allocation.devices.results[]`), which the extender must read to
count right. Kept as kube-scheduler's allocator keeps them (its pools and allocated-devices trackers):

- A pool is the newest generation of the slices of one (driver, pool name), used only once complete (as many
  slices of that generation as each says the pool has). An incomplete pool gives the node no GPU.
- Every allocated result of a GPU driver takes its device, whatever `reservedFor` says; a result with admin access
  takes none. A share of a device (consumable capacity) takes it whole for us, and a MIG result makes the GPU
  under it unusable as a whole GPU. A device with a
  NoSchedule or NoExecute taint is unusable too (a pod may tolerate it; the extender does not promise it).
- Devices join the node's topology by their `uuid`: a GPU of the topology that no device of the pool names cannot
  be allocated there, so it is taken as well.
- A claim not allocated yet whose selector pins GPUs by UUID (the planner's, extender/pinning/planner.py) holds
  them too: kube-scheduler will allocate exactly those, so no other pod is promised them meanwhile.
- Templates are kept for the planner and the admission webhook: which ask whole GPUs and nothing else.

Not thread-safe: the cluster state calls it under its ledger lock. Work per event is one slice or one claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from extender.api.dra import (COMPUTE_DOMAIN_DRIVER, GPU_CLASS, GPU_DRIVER, ClaimAsk, ClaimTemplate, ClaimUnseen,
                              DraError, ResourceClaim, ResourceSlice, SliceDevice, parse_claim, parse_slice,
                              parse_template)
from topology import bounds

log = logging.getLogger(__name__)

PoolId = tuple[str, str]  # (driver, pool name)


class NodeClass(Enum):
    DEVICE_PLUGIN = "device-plugin"  # GPUs from the device plugin: the node's allocatable counts them
    DRA_GPU = "dra-gpu"  # GPUs from a DRA driver: claims count them
    COMPUTE_DOMAIN_ONLY = "compute-domain-only"  # GPUs from the device plugin, IMEX channels from DRA (GB200)


class DraInventory:
    def __init__(self, gpu_drivers: Iterable[str] = (GPU_DRIVER,), gpu_classes: Iterable[str] = (GPU_CLASS,),
                 on_node: Callable[[str], None] = lambda node: None) -> None:
        """`gpu_classes` the DeviceClasses whose requests are for whole GPUs; `on_node` is told of each node whose
        DRA GPUs changed (published, allocated or freed)."""
        self.gpu_drivers = frozenset(gpu_drivers)
        self.gpu_classes = frozenset(gpu_classes)
        self._on_node = on_node
        self._slices: dict[str, ResourceSlice] = {}
        self._pools: dict[PoolId, set[str]] = {}  # -> its slices' names
        # The complete pool's devices, in the order the allocator tries them (slices by name, then as listed), else None
        self._devices: dict[PoolId, dict[str, SliceDevice] | None] = {}
        self._node_of: dict[PoolId, str] = {}
        self._pools_of: dict[str, set[PoolId]] = {}  # node -> its pools, of every driver
        self._claims: dict[str, ResourceClaim] = {}  # only claims with a result of a GPU driver
        self._taken: dict[tuple[str, str, str], set[str]] = {}  # (driver, pool, device) -> claim uids
        self._claims_in: dict[PoolId, set[str]] = {}  # pool -> uids of the claims with a result in it
        self._requested: dict[str, tuple[str, ClaimAsk]] = {}  # every claim's namespace/name -> (uid, its ask)
        self._pins: dict[str, frozenset[str]] = {}  # uid of an unallocated claim -> the GPU UUIDs it pins
        self._pinned: dict[str, int] = {}  # GPU UUID -> how many unallocated claims pin it
        self._uuid_node: dict[str, str] = {}  # GPU UUID -> its node, for the complete pools
        self._templates: dict[str, ClaimTemplate] = {}  # namespace/name -> the template
        self.refused: dict[str, str] = {}  # object -> why it was refused, for the log and the metric

    # -- watches ---------------------------------------------------------------------------------------

    def apply_slice(self, kind: str, obj: Any) -> None:
        name = _metadata(obj, "name")
        if kind == "DELETED":
            self._drop_slice(name)
            return
        try:
            parsed = parse_slice(obj)
        except DraError as error:
            self._refuse(f"ResourceSlice {name[:63]}", str(error))
            self._drop_slice(name)
            return
        if parsed.driver not in self.gpu_drivers and parsed.driver != COMPUTE_DOMAIN_DRIVER:
            return
        if parsed.name not in self._slices and len(self._slices) >= bounds.MAX_SLICES:
            self._refuse(f"ResourceSlice {parsed.name}", f"more than {bounds.MAX_SLICES} slices are kept")
            return
        self.refused.pop(f"ResourceSlice {parsed.name}", None)
        self._drop_slice(parsed.name)
        self._slices[parsed.name] = parsed
        pool = (parsed.driver, parsed.pool)
        self._pools.setdefault(pool, set()).add(parsed.name)
        self._settle(pool)

    def replace_slices(self, items: list[dict[str, Any]]) -> None:
        for name in list(self._slices):
            self._drop_slice(name)
        for item in items:
            self.apply_slice("ADDED", item)

    def apply_claim(self, kind: str, obj: Any) -> None:
        uid = _metadata(obj, "uid")
        if kind == "DELETED":
            self._drop_claim(uid)
            key = f"{_metadata(obj, 'namespace')}/{_metadata(obj, 'name')}"
            found = self._requested.get(key)
            if found is not None and found[0] == uid:
                del self._requested[key]
            return
        try:
            parsed = parse_claim(obj)
        except DraError as error:
            # Refused, its devices stay as they were: dropping them would hand GPUs in use to another pod.
            self._refuse(f"ResourceClaim {uid[:63]}", str(error))
            return
        self.refused.pop(f"ResourceClaim {uid[:63]}", None)
        if parsed.key not in self._requested and len(self._requested) >= bounds.MAX_CLAIMS:
            self._refuse(f"ResourceClaim {uid[:63]}", f"more than {bounds.MAX_CLAIMS} claims are kept")
            return
        ask = self._ask(parsed)
        self._requested[parsed.key] = (parsed.uid, ask)
        self._drop_claim(parsed.uid)
        if not parsed.results and ask.pinned:
            self._pin(parsed.uid, ask.pinned)
        results = [result for result in parsed.results if result.driver in self.gpu_drivers and not result.admin_access]
        if not results:
            return
        self._claims[parsed.uid] = parsed
        for result in results:
            self._taken.setdefault((result.driver, result.pool, result.device), set()).add(parsed.uid)
            self._claims_in.setdefault((result.driver, result.pool), set()).add(parsed.uid)
        self._tell({self._node_of.get((result.driver, result.pool), result.pool) for result in results})

    def replace_claims(self, items: list[dict[str, Any]]) -> None:
        for uid in {*self._claims, *self._pins}:
            self._drop_claim(uid)
        self._requested.clear()
        for item in items:
            self.apply_claim("ADDED", item)

    def apply_template(self, kind: str, obj: Any) -> None:
        key = f"{_metadata(obj, 'namespace')}/{_metadata(obj, 'name')}"
        self._templates.pop(key, None)
        if kind == "DELETED":
            return
        try:
            parsed = parse_template(obj)
        except DraError as error:
            self._refuse(f"ResourceClaimTemplate {key[:127]}", str(error))
            return
        self.refused.pop(f"ResourceClaimTemplate {key[:127]}", None)
        if len(self._templates) >= bounds.MAX_CLAIMS:
            self._refuse(f"ResourceClaimTemplate {key[:127]}", f"more than {bounds.MAX_CLAIMS} templates are kept")
            return
        self._templates[parsed.key] = parsed

    def replace_templates(self, items: list[dict[str, Any]]) -> None:
        self._templates.clear()
        for item in items:
            self.apply_template("ADDED", item)

    # -- reads -----------------------------------------------------------------------------------------

    def node_class(self, node: str) -> NodeClass:
        drivers = {driver for driver, _ in self._pools_of.get(node, ())}
        if drivers & self.gpu_drivers:
            return NodeClass.DRA_GPU
        if COMPUTE_DOMAIN_DRIVER in drivers:
            return NodeClass.COMPUTE_DOMAIN_ONLY
        return NodeClass.DEVICE_PLUGIN

    def taken(self, node: str, gpu_ids: Iterable[str]) -> frozenset[str] | None:
        """Of a DRA node's GPUs (by UUID), those no pod may be given now; None for a node DRA gives no GPU."""
        found = self.occupancy(node, gpu_ids)
        return None if found is None else found[0]

    def occupancy(self, node: str, gpu_ids: Iterable[str]) -> tuple[frozenset[str], frozenset[str]] | None:
        """(`taken`, and of those the GPUs held by nothing but the pin of a claim not allocated yet, which the one
        pod whose claim pins them may still be given), in one pass; None for a node DRA gives no GPU."""
        found = self._usable(node)
        if found is None:
            return None
        usable, blocked = found
        pinned = self._pinned
        taken = frozenset(gpu for gpu in gpu_ids if gpu not in usable or gpu in blocked or gpu in pinned)
        return taken, frozenset(gpu for gpu in taken if gpu in pinned and gpu in usable and gpu not in blocked)

    def _usable(self, node: str) -> tuple[set[str], set[str]] | None:
        """(whole GPUs published untainted and unallocated, GPUs blocked by an allocation or a taint), by UUID."""
        pools = [pool for pool in self._pools_of.get(node, ()) if pool[0] in self.gpu_drivers]
        if not pools:
            return None
        usable: set[str] = set()
        blocked: set[str] = set()
        for pool in pools:
            devices = self._devices.get(pool)
            for name, device in (devices or {}).items():
                held = bool(self._taken.get((pool[0], pool[1], name)))
                if device.whole and device.uuid is not None and not device.tainted and not held:
                    usable.add(device.uuid)
                elif device.uuid is not None and (held or device.tainted):
                    blocked.add(device.uuid)
                if not device.whole and held and device.parent_uuid is not None:
                    blocked.add(device.parent_uuid)
        return usable, blocked

    def claim_state(self, namespace: str, name: str) -> tuple[str, bool] | None:
        """(uid, allocated) of a claim seen, or None."""
        found = self._requested.get(f"{namespace}/{name}")
        return None if found is None else (found[0], found[0] in self._claims)

    def allocated_elsewhere(self, node: str, gpus: Iterable[str], own: set[str]) -> bool:
        """Whether a claim other than `own` (uids) has been allocated any of these GPUs of the node."""
        wanted = set(gpus)
        for pool in self._pools_of.get(node, ()):
            for name, device in (self._devices.get(pool) or {}).items():
                if device.uuid in wanted and self._taken.get((pool[0], pool[1], name), set()) - own:
                    return True
        return False

    def gpu_driver(self, node: str) -> str | None:
        """The GPU driver that publishes the node's GPUs (the one a pin's selector names), if one does."""
        return min((driver for driver, _ in self._pools_of.get(node, ()) if driver in self.gpu_drivers), default=None)

    def template(self, namespace: str, name: str) -> ClaimTemplate | None:
        return self._templates.get(f"{namespace}/{name}")

    def whole_gpus(self, template: ClaimTemplate) -> int:
        """The GPUs a template asks for when it asks whole GPUs of our classes and nothing else, each request a
        plain count (no selector, no alternatives, no admin access): then a pin says all of it. Else 0."""
        requests = template.requests
        if not requests or any(len(request.alternatives) != 1 or request.selected or request.admin_access
                               or request.alternatives[0][0] not in self.gpu_classes
                               or request.alternatives[0][1] == 0 for request in requests):
            return 0
        return sum(request.alternatives[0][1] for request in requests)

    def requested_gpus(self, namespace: str, names: Iterable[str]) -> ClaimAsk:
        """The whole GPUs a pod's claims ask for: each request's first alternative (the one the allocator tries
        first) of a GPU class. A request for all of a class's devices (allocation mode All) counts none: its size
        is the node's, and kube-scheduler's DRA plugin places it. And whether a GPU request has CEL selectors of its
        own, which narrow the devices (a UUID pin, a product): then the allocator's pick is not the node's first
        fit. ClaimUnseen for a claim not delivered yet."""
        total, selected, pinned = 0, False, frozenset[str]()
        for name in names:
            found = self._requested.get(f"{namespace}/{name}")
            if found is None:
                raise ClaimUnseen(f"ResourceClaim {namespace}/{name[:63]} is not seen yet")
            total += found[1].gpus
            selected = selected or found[1].selected
            pinned |= found[1].pinned
        return ClaimAsk(total, selected, pinned)

    def order(self, node: str) -> tuple[str, ...]:
        """The UUIDs of the node's whole GPUs in the order kube-scheduler's allocator tries them: pools by (driver,
        pool name), slices by name, devices as listed (its incubating allocator, research/dra.md §3.2)."""
        found: list[str] = []
        for pool in sorted(pool for pool in self._pools_of.get(node, ()) if pool[0] in self.gpu_drivers):
            found += [device.uuid for device in (self._devices.get(pool) or {}).values()
                      if device.whole and device.uuid is not None]
        return tuple(found)

    def held_by(self, pod_uid: str, node: str) -> frozenset[str]:
        """The UUIDs of the whole GPUs that the claims reserved for the pod hold on the node."""
        held: set[str] = set()
        for pool in self._pools_of.get(node, ()):
            devices = self._devices.get(pool) or {}
            for uid in self._claims_in.get(pool, ()):
                claim = self._claims[uid]
                if pod_uid in claim.reserved_for:
                    held.update(devices[result.device].uuid or "" for result in claim.results
                                if (result.driver, result.pool) == pool and result.device in devices)
        held.discard("")
        return frozenset(held)

    def pods_on(self, node: str) -> frozenset[str]:
        """UIDs of the pods that the GPU claims allocated on the node are reserved for."""
        return frozenset(pod for pool in self._pools_of.get(node, ()) for uid in self._claims_in.get(pool, ())
                         for pod in self._claims[uid].reserved_for)

    def unknown_devices(self) -> int:
        """Allocated GPU devices that no complete pool publishes: a claim naming a device no slice has."""
        return sum(1 for (driver, pool, device), uids in self._taken.items()
                   if uids and device not in (self._devices.get((driver, pool)) or {}))

    # -- bookkeeping -----------------------------------------------------------------------------------

    def _ask(self, claim: ResourceClaim) -> ClaimAsk:
        requests = [request for request in claim.requests
                    if request.alternatives[0][0] in self.gpu_classes and not request.admin_access]
        return ClaimAsk(sum(request.alternatives[0][1] for request in requests),
                        any(request.selected for request in requests),
                        frozenset(uuid for request in requests for uuid in request.pinned))

    def _settle(self, pool: PoolId) -> None:
        """The pool's newest generation, if complete: its devices and its node."""
        names = self._pools.get(pool, set())
        slices = [self._slices[name] for name in names]
        previous = self._node_of.pop(pool, None)
        if previous is not None:
            self._pools_of.get(previous, set()).discard(pool)
        for device in (self._devices.get(pool) or {}).values():
            if device.uuid is not None and self._uuid_node.get(device.uuid) == previous:
                del self._uuid_node[device.uuid]
        if not slices:
            self._pools.pop(pool, None)
            self._devices.pop(pool, None)
            self._tell({previous} - {None})
            return
        newest = max(piece.generation for piece in slices)
        current = [piece for piece in slices if piece.generation == newest]
        nodes = {piece.node for piece in current}
        node = nodes.pop() if len(nodes) == 1 else None
        complete = len(current) == current[0].slice_count and all(p.slice_count == len(current) for p in current)
        devices: dict[str, SliceDevice] = {}
        for piece in sorted(current, key=lambda piece: piece.name) if complete and node is not None else ():
            for device in piece.devices:
                if device.name in devices:
                    complete = False  # one device in two slices: the pool is not one kube-scheduler would use
                devices[device.name] = device
        self._devices[pool] = devices if complete else None
        if node is not None:
            self._node_of[pool] = node
            self._uuid_node.update((device.uuid, node) for device in devices.values() if device.uuid is not None)
            self._pools_of.setdefault(node, set()).add(pool)
        self._tell({previous, node} - {None})

    def _drop_slice(self, name: str) -> None:
        found = self._slices.pop(name, None)
        if found is None:
            return
        pool = (found.driver, found.pool)
        self._pools.get(pool, set()).discard(name)
        self._settle(pool)

    def _pin(self, uid: str, uuids: frozenset[str]) -> None:
        self._pins[uid] = uuids
        for uuid in uuids:
            self._pinned[uuid] = self._pinned.get(uuid, 0) + 1
        self._tell({self._uuid_node[uuid] for uuid in uuids if uuid in self._uuid_node})

    def _unpin(self, uid: str) -> None:
        uuids = self._pins.pop(uid, frozenset())
        for uuid in uuids:
            left = self._pinned.pop(uuid, 1) - 1
            if left:
                self._pinned[uuid] = left
        self._tell({self._uuid_node[uuid] for uuid in uuids if uuid in self._uuid_node})

    def _drop_claim(self, uid: str) -> None:
        self._unpin(uid)
        claim = self._claims.pop(uid, None)
        if claim is None:
            return
        nodes: set[str] = set()
        for result in claim.results:
            key = (result.driver, result.pool, result.device)
            holders = self._taken.get(key)
            if holders is not None:
                holders.discard(uid)
                if not holders:
                    del self._taken[key]
                pool = (result.driver, result.pool)
                claims = self._claims_in.get(pool, set())
                claims.discard(uid)
                if not claims:
                    self._claims_in.pop(pool, None)
                nodes.add(self._node_of.get(pool, result.pool))
        self._tell(nodes)

    def _tell(self, nodes: set[str]) -> None:
        for node in nodes:
            self._on_node(node)

    def _refuse(self, what: str, why: str) -> None:
        if self.refused.get(what) != why:
            log.warning("%s", why)
        if what in self.refused or len(self.refused) < bounds.MAX_SLICES:
            self.refused[what] = why


def _metadata(obj: Any, field: str) -> str:
    """A field of an object's metadata, as far as it can be read: a DELETED event may carry a malformed object."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    value = metadata.get(field) if isinstance(metadata, dict) else None
    return value[:bounds.MAX_POOL_NAME_LENGTH] if isinstance(value, str) else ""
