"""How many members a group has, where the cluster already says so in a PodGroup object.

A pod labelled `scheduling.x-k8s.io/pod-group` names a PodGroup of the coscheduling plugin
(scheduler-plugins, `scheduling.x-k8s.io/v1alpha1`), whose `spec.minMember` is the gang's size. A pod with
`spec.schedulingGroup.podGroupName` names kube-scheduler's own PodGroup (KEP-4671, `scheduling.k8s.io/v1alpha2`
in v1.36, alpha behind GenericWorkload), whose `spec.schedulingPolicy.gang.minCount` is; a `basic` policy has no
gang, so no size. Either object may be absent (the CRD not installed, the API not enabled): the reflector backs
off, and such a group is placed as its `gpu-topology.io/group-size`, or, without one, as single pods.

Each kind is watched by a reflector (extender/kube/reflector.py) into `ClusterState.group_sizes`, keyed as
`GroupRequest.key` keys the group.
"""

from __future__ import annotations

from typing import Any

from extender.api.group_request import GroupRequest, PodGroupKind


class GroupSizes:
    """A reflector's sink for one kind of PodGroup: its objects' sizes into the shared map."""

    def __init__(self, kind: PodGroupKind, sizes: dict[str, int]) -> None:
        self.kind = kind
        self._sizes = sizes

    def replace(self, items: list[dict[str, Any]]) -> None:
        prefix = f"{self.kind.source.value}:"
        for key in [key for key in self._sizes if key.partition("/")[2].startswith(prefix)]:
            del self._sizes[key]
        for item in items:
            self.apply("ADDED", item)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata")
        if not isinstance(metadata, dict):
            return
        name, namespace = metadata.get("name"), metadata.get("namespace")
        if not isinstance(name, str) or not isinstance(namespace, str):
            return
        key = GroupRequest(name, self.kind.source, None, "", False).key(namespace)
        size = None if event_type == "DELETED" else self.kind.size(obj)
        if size is None:
            self._sizes.pop(key, None)
        else:
            self._sizes[key] = size

    def synced(self) -> None:
        """PodGroups are optional: the extender is ready without them."""
