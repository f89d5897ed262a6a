"""The reporter's loop: observe, plan, patch, wait. No Kubernetes or gRPC here: the node and the kubelet
come in through two small protocols, so tests drive the loop with the real edges or with fakes.

Each round reads pod-resources and NVML health, plans the patch (`annotation_patch.py`) and sends it if there is one.
Waits between rounds:
- `interval` (default 5 s) when all went well: a change in pod-resources is published within one interval;
- jittered exponential backoff when pod-resources is unreachable (the state is then unknown) or the API
  server refused or did not answer the patch (409, 5xx, timeouts, anything else). The next attempt re-reads
  everything, so it sends the latest state, never a stale retry. Never a tight loop.

What the node carries is read once at start (GET) and then taken from each patch's answer, so a topology
annotation someone edited is put back after the next write (at the latest, the next heartbeat's).

The node's NVLink domain (topology/fabric.py) is read again each round, from NVML through `fabric`: the fabric
manager registers GPUs after boot, so a node may start with its registration in progress and complete it minutes
later. A new reading changes the topology annotation, which the plan then rewrites as any topology change.

Every wait is on `stop` (a threading.Event), which a SIGTERM handler sets, so the loop ends promptly. An
NVML failure that is not about one GPU (`NvmlUnavailable`) ends the loop with that error: the DaemonSet
restarts the reporter, and meanwhile the node's state grows stale, which the extender treats as unknown.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol, TextIO

import orjson

from topology.agent.annotation_patch import NodeAnnotations, plan
from topology.agent.devices import DevicesUnavailable, GpuIds, KubeletDevices, Observation, Unknown, observe
from topology.agent.dra import DraDevices
from topology.annotations import AnnotationKeys
from topology.backoff import Backoff
from topology.codec import CodecError, encode_topology
from topology.fabric import Domain, describe
from topology.model import Topology

log = logging.getLogger("gpu-topology-agent")

DEFAULT_RESOURCE = "nvidia.com/gpu"


class NodeError(Exception):
    """Reading or patching the node failed: `status` is the HTTP status, None when there was no answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Node(Protocol):
    """This node's annotations: read them, and merge-patch ours (None deletes). Failures raise NodeError."""

    def annotations(self) -> Mapping[str, str]: ...

    def patch_annotations(self, annotations: Mapping[str, str | None]) -> Mapping[str, str]: ...


class DeviceSource(Protocol):
    """The kubelet's device assignments; raises DevicesUnavailable when they cannot be read."""

    def read(self) -> KubeletDevices: ...


class HealthSource(Protocol):
    def check(self, topology: Topology) -> Mapping[str, str]: ...


class PrintingNode:
    """`--dry-run`: a node that starts with none of our annotations and prints each patch as one JSON line
    (the annotations it would set; null removes one) instead of sending it."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out
        self._annotations: dict[str, str] = {}

    def annotations(self) -> Mapping[str, str]:
        return dict(self._annotations)

    def patch_annotations(self, annotations: Mapping[str, str | None]) -> Mapping[str, str]:
        out = self._out or sys.stdout
        out.write(orjson.dumps(dict(annotations)).decode() + "\n")
        out.flush()
        for key, value in annotations.items():
            if value is None:
                self._annotations.pop(key, None)
            else:
                self._annotations[key] = value
        return dict(self._annotations)


RESTART_HOLD_SECONDS = 15.0
"""How long the pods of a List that emptied at once stay in the report: three polls at the default interval, well
past the kubelet's first pod list after a restart, which the kubelet v1.36 in the e2e suite took about a second
for. A node whose last pods end is seen free that much later."""


class Reporter:
    """Publishes one node's topology and GPU state. `run()` blocks until `stop` is set (or one round with
    `once`). `fabric` reads the node's NVLink domain each round (None: the topology's stays). `dra`: on a DRA node,
    the pods' GPUs are their claims' devices (`devices` reads them), not a device plugin's. `monotonic`, `wall`
    and the backoffs are injectable for tests."""

    def __init__(self, topology: Topology, node: Node, devices: DeviceSource, health: HealthSource | None = None,
                 *, fabric: Callable[[], Domain] | None = None, dra: DraDevices | None = None,
                 keys: AnnotationKeys | None = None,
                 gpu_resource: str = DEFAULT_RESOURCE, interval: float = 5.0, heartbeat: float = 30.0,
                 stop: threading.Event | None = None, monotonic: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 api_backoff: Backoff | None = None, devices_backoff: Backoff | None = None) -> None:
        if interval <= 0 or heartbeat <= 0:
            raise ValueError("interval and heartbeat must be positive")
        self.topology = topology
        self.topology_text = encode_topology(topology)  # CodecError when over its size budget
        self.keys = keys or AnnotationKeys()
        self.gpu_resource = gpu_resource
        self.interval, self.heartbeat = interval, heartbeat
        self.stop = stop or threading.Event()
        self._node, self._devices, self._health, self._fabric, self._dra = node, devices, health, fabric, dra
        self._ids = GpuIds(topology)
        self._monotonic, self._wall = monotonic, wall
        self.api_backoff = api_backoff or Backoff(initial=1.0, maximum=30.0)
        self.devices_backoff = devices_backoff or Backoff(initial=1.0, maximum=30.0)
        self.node_state: NodeAnnotations | None = None  # None until the node has been read
        self.observation: Observation | Unknown | None = None
        self.rounds = 0
        self.writes = 0
        self.last_error: str | None = None  # the last failed patch or read of the node, None after a success
        self._said: dict[str, object] = {}
        self._retrying = True
        self._emptied: float | None = None  # when the List lost every pod at once (_hold_over_restart)
        self._known: Observation | None = None  # the last List read, as reported

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self, once: bool = False) -> int:
        """0 when stopped (or, with `once`, when the round's patch landed); 1 when `once` failed."""
        self._retrying = not once
        if not self.load(once):
            return 0 if self.stop.is_set() else 1
        while True:
            delay = self.round()
            if once:
                return 1 if self.last_error else 0
            if self.stop.wait(delay):
                return 0

    def load(self, once: bool = False) -> bool:
        """Read what the node carries, retrying with backoff; False when stopped (or, with `once`, failed)."""
        while not self.stop.is_set():
            try:
                self.node_state = NodeAnnotations.read(self._node.annotations(), self.keys)
            except NodeError as error:
                self._failed(error)
                if once or self.stop.wait(self.api_backoff.next()):
                    return False
                continue
            self.api_backoff.reset()
            self.last_error = None
            return True
        return False

    def round(self) -> float:
        """One round; the delay before the next."""
        assert self.node_state is not None, "load() first"
        self.rounds += 1
        now, observed = self._monotonic(), self._wall()
        retry: list[float] = []  # backoff delays of what failed this round
        try:
            devices = self._devices.read()
        except DevicesUnavailable as error:
            devices = None
            retry.append(self.devices_backoff.next())
            observation: Observation | Unknown = Unknown(str(error))
        else:
            self.devices_backoff.reset()
        health = self._health.check(self.topology) if self._health is not None else {}
        if devices is not None:
            seen = (self._dra.observe(devices, health) if self._dra is not None
                    else observe(self._ids, devices, health, self.gpu_resource))
            observation = self._hold_over_restart(seen, now)
        if self._fabric is not None:
            self._follow(self._fabric())
        self.observation = observation
        self._tell(observation)
        node = self.node_state
        decided = plan(self.keys, self.topology_text, observation, node, now, self.heartbeat, observed)
        if decided.refused:
            log.error("%s", decided.refused)
        if decided.writes:
            try:
                after = self._node.patch_annotations(decided.patch)
            except NodeError as error:
                self._failed(error)
                retry.append(self.api_backoff.next())
            else:
                self.api_backoff.reset()
                self.last_error = None
                self.writes += 1
                generation = max(node.generation, decided.state.generation if decided.state else 0)
                written = now if decided.state else (None if self.keys.state in decided.patch else node.written)
                self.node_state = NodeAnnotations.read(after, self.keys, generation=generation, written=written)
                log.log(logging.DEBUG if decided.why == ("heartbeat",) else logging.INFO, "wrote annotations: %s",
                        "; ".join(decided.why))
        return max(retry) if retry else self.interval

    def _hold_over_restart(self, observation: Observation | Unknown, now: float) -> Observation | Unknown:
        """A restarted kubelet lists no pod until its first pod list arrives (about a second with v1.36), though
        its checkpoint keeps every allocation and the containers run on: published as is, that empty List would
        free every GPU of the node to the extender, which would bind them again. So when the List loses every pod
        at once, the last pods stay in the report until the List shows a pod again or RESTART_HOLD_SECONDS pass.
        Pods that all end together are then freed that much later: never a GPU given twice."""
        if not isinstance(observation, Observation):
            return observation  # a kubelet down between its runs: what it listed last still counts
        previous, self._known = self._known, observation
        if observation.pods:
            self._emptied = None
            return observation
        if previous is None or not previous.pods:
            return observation
        if self._emptied is None:
            self._emptied = now
            log.warning("the kubelet lists no pod while %d held GPUs: a restart? keeping them used for up to %g s",
                        len(previous.pods), RESTART_HOLD_SECONDS)
        if now - self._emptied >= RESTART_HOLD_SECONDS:
            return observation
        held = replace(observation, used=observation.used | previous.used, pods=previous.pods)
        self._known = held
        return held

    def _follow(self, domain: Domain) -> None:
        """Carry a new domain reading in the topology annotation; one that would not fit its budget is left out."""
        if domain == self.topology.domain:
            return
        topology = replace(self.topology, domain=domain)
        try:
            self.topology_text = encode_topology(topology)
        except CodecError as error:
            self._changed("domain refused", domain, logging.ERROR, f"{error}: not publishing {describe(domain)}")
            return
        self.topology = topology

    # -- telling people ----------------------------------------------------------------------------------

    def _failed(self, error: NodeError) -> None:
        self.last_error = str(error)
        level = logging.WARNING if error.status in (None, 409, 429) or (error.status or 0) >= 500 else logging.ERROR
        log.log(level, "%s%s", error, "; retrying with backoff" if self._retrying else "")

    def _tell(self, observation: Observation | Unknown) -> None:
        """Log what changed since the last round, once, not every round."""
        domain = self.topology.domain
        said = domain if domain is not None and (domain.name or domain.problem) else None
        self._changed("domain", said, logging.WARNING if said and said.problem else logging.INFO, describe(domain))
        if isinstance(observation, Unknown):
            self._changed("unknown", observation.reason, logging.WARNING, f"GPU state unknown: {observation.reason}")
            return
        self._changed("unknown", None, logging.INFO, "GPU state known again")
        reasons = dict(observation.reasons)
        self._changed("unhealthy", reasons, logging.WARNING if reasons else logging.INFO, "unhealthy GPUs: " + (
            "; ".join(f"{gpu}: {why}" for gpu, why in sorted(reasons.items())) or "none"))
        self._changed("used", observation.used, logging.INFO,
                      "GPUs in use: " + (", ".join(sorted(observation.used)) or "none"))
        self._changed("notes", observation.notes, logging.WARNING, "; ".join(observation.notes))

    def _changed(self, topic: str, value: object, level: int, message: str) -> None:
        """Log `message` when `value` differs from the last round's; a first value that is empty is not news,
        and neither is an empty message."""
        previous = self._said.get(topic, _UNSAID)
        self._said[topic] = value
        if previous == value or (previous is _UNSAID and not value) or not message:
            return
        log.log(level, "%s", message)


_UNSAID = object()
