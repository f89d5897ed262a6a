"""The leader's label on its own Pod, which the Service selects: how kube-scheduler reaches the leader alone.

Readiness says "this replica can serve or take over", so a warm standby is Ready and a Deployment can roll and
a drain can evict the leader. Routing is this label instead (Patroni's pattern): the replica that leads, with its
ledger rebuilt, sets `gpu-topology.io/leader: "true"` on its own Pod; one that stops leading removes it first
thing, and keeps trying in the background until that succeeds or it leads again.

Nothing here is trusted for safety. Two labelled Pods for a moment (an old leader cut off from the API server
cannot remove its label) only means kube-scheduler may reach a standby, which refuses bind with a reason
kube-scheduler retries on, and answers filter and prioritize from its warm cache.

The state the label should have is polled (`leads()` is a few reads under a lock): leading ends when the renew
deadline passes, with no event to wait for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from extender.kube.client import KubeError

log = logging.getLogger(__name__)

LEADER_VALUE = "true"


class PodLabels(Protocol):
    """The one call this needs (`extender.kube.client.KubernetesApi.label_pod`); raises `KubeError`."""

    def label_pod(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> None: ...


class LeaderLabel:
    """Keeps `key: "true"` on the Pod `namespace/pod` exactly while `leads()` holds, from a daemon thread
    (`start`), or one `sync()` at a time in tests."""

    def __init__(self, api: PodLabels, namespace: str, pod: str, key: str, leads: Callable[[], bool], *,
                 period: float = 0.2, retry: float = 1.0) -> None:
        if not namespace or not pod:
            raise ValueError("the leader label needs this replica's Pod name and namespace")
        self.api, self.namespace, self.pod, self.key, self._leads = api, namespace, pod, key, leads
        self.period, self.retry = period, retry
        # What the Pod is known to carry: None at start, since a restarted container keeps its Pod's labels.
        self._labelled: bool | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def labelled(self) -> bool | None:
        """Whether the last successful write set the label (None: nothing written yet)."""
        return self._labelled

    def sync(self) -> bool:
        """One write if the Pod's label differs from what `leads()` says; True when they agree afterwards."""
        wanted = self._leads()
        if wanted == self._labelled:
            return True
        return self._write(wanted)

    def _write(self, labelled: bool) -> bool:
        try:
            self.api.label_pod(self.namespace, self.pod, {self.key: LEADER_VALUE if labelled else None})
        except KubeError as error:
            log.warning("leader label: could not %s %s on pod %s/%s: %s; retrying",
                        "set" if labelled else "remove", self.key, self.namespace, self.pod, error)
            return False
        self._labelled = labelled
        log.info("leader label: %s %s on pod %s/%s", "set" if labelled else "removed", self.key, self.namespace,
                 self.pod)
        return True

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the leader label is already kept")
        self._thread = threading.Thread(target=self._run, name="leader-label", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._stopping.wait(self.period if self.sync() else self.retry)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop keeping the label and remove it (one attempt: a label left behind only sends kube-scheduler to
        a replica that is gone, and the endpoints drop a terminating Pod anyway). Call it before the Lease is
        released, so the Service stops routing here before a successor leads."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._labelled is not False:
            self._write(False)
