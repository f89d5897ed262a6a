"""Which group a pod belongs to, what the group asks of its placement (DESIGN §10), and the PodGroup kinds
whose objects state its size (extender/groups/sizes.py reads them).

A group is named three ways, read in this order: our own annotations (`gpu-topology.io/group` with its size,
span and placement), the coscheduling plugin's label `scheduling.x-k8s.io/pod-group`, whose PodGroup object
holds `minMember`, and kube-scheduler's own pod group (KEP-4671, v1.36 `spec.schedulingGroup.podGroupName`,
alpha behind GenericWorkload), whose PodGroup holds `schedulingPolicy.gang.minCount`. Our annotations refine the
other two: a pod labelled for coscheduling may still say its span and placement, or its size.

Every value is untrusted. A malformed one raises ValueError with a reason that names the annotation, which the
pod's request carries as its problem: filter refuses it on every node, and nothing is held for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from topology.annotations import AnnotationKeys
from topology.bounds import MAX_GROUP_SIZE

NVLINK_DOMAIN = "nvlink-domain"
"""The span of one multi-node NVLink domain (an NVL72 rack): the innermost level above the node."""
COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a DNS subdomain, as PodGroup names are
LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


class GroupSource(str, Enum):
    ANNOTATION = "annotation"
    COSCHEDULING = "coscheduling"  # scheduler-plugins' PodGroup (scheduling.x-k8s.io/v1alpha1), minMember
    SCHEDULING_GROUP = "scheduling-group"  # kube-scheduler's PodGroup (scheduling.k8s.io/v1alpha2), gang.minCount


@dataclass(frozen=True, slots=True)
class GroupRequest:
    name: str
    source: GroupSource
    size: int | None  # members with GPUs; None: the group's PodGroup object says (extender/groups/sizes.py)
    span: str  # NVLINK_DOMAIN or a --topology-levels key
    required: bool
    segment: int | None = None  # members that must share one NVLink domain (Slurm's --segment); None: no such rule

    def key(self, namespace: str) -> str:
        """The group's identity: groups are namespaced, and one name from two sources is two groups."""
        prefix = "" if self.source is GroupSource.ANNOTATION else f"{self.source.value}:"
        return f"{namespace}/{prefix}{self.name}"


def parse_group(metadata: Mapping[str, Any], spec: Mapping[str, Any], keys: AnnotationKeys) -> GroupRequest | None:
    """The pod's group, or None when it names none."""
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") if isinstance(metadata.get("labels"), dict) else {}
    named = _named(annotations, labels, spec, keys)
    if named is None:
        for key in (keys.group_size, keys.group_span, keys.group_placement, keys.group_segment):
            if key in annotations:
                raise ValueError(f"{key}: set without {keys.group} naming the group")
        return None
    name, source = named
    size = _size(annotations.get(keys.group_size), keys.group_size)
    if size is None and source is GroupSource.ANNOTATION:
        raise ValueError(f"{keys.group_size}: missing; a group named by {keys.group} says how many members "
                         f"have GPUs (1 to {MAX_GROUP_SIZE})")
    span = str(annotations.get(keys.group_span, NVLINK_DOMAIN)).strip()
    if span != NVLINK_DOMAIN and not LABEL_KEY.fullmatch(span):
        raise ValueError(f"{keys.group_span}: {span[:63]!r} is neither {NVLINK_DOMAIN} nor a node-label key")
    placement = str(annotations.get(keys.group_placement, "preferred")).strip().lower()
    if placement not in ("required", "preferred"):
        raise ValueError(f"{keys.group_placement}: unknown value {placement[:40]!r}; expected required | preferred")
    segment = _size(annotations.get(keys.group_segment), keys.group_segment)
    if segment is not None and size is not None and size % segment:
        raise ValueError(f"{keys.group_segment}: {segment} does not divide the group's {size} members")
    return GroupRequest(name, source, size, span, placement == "required", segment)


def _named(annotations: Mapping[str, Any], labels: Mapping[str, Any], spec: Mapping[str, Any],
           keys: AnnotationKeys) -> tuple[str, GroupSource] | None:
    found: list[tuple[Any, GroupSource, str]] = [
        (annotations.get(keys.group), GroupSource.ANNOTATION, keys.group),
        (labels.get(COSCHEDULING_LABEL), GroupSource.COSCHEDULING, COSCHEDULING_LABEL),
    ]
    scheduling_group = spec.get("schedulingGroup")
    if isinstance(scheduling_group, dict):
        found.append((scheduling_group.get("podGroupName"), GroupSource.SCHEDULING_GROUP,
                      "spec.schedulingGroup.podGroupName"))
    for value, source, where in found:
        if value is None:
            continue
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise ValueError(f"{where}: {str(value)[:63]!r} is not a group name (a DNS subdomain)")
        return value, source
    return None


def _size(raw: Any, key: str) -> int | None:
    """A count of members in annotation `key`, 1 to MAX_GROUP_SIZE; None where absent."""
    if raw is None:
        return None
    text = str(raw).strip()
    if not text.isdigit() or len(text) > 5 or not 1 <= int(text) <= MAX_GROUP_SIZE:
        raise ValueError(f"{key}: {text[:40]!r} is not a whole number of members from 1 to {MAX_GROUP_SIZE}")
    return int(text)


def _min_member(spec: dict[str, Any]) -> Any:
    return spec.get("minMember")


def _gang_min_count(spec: dict[str, Any]) -> Any:
    policy = spec.get("schedulingPolicy")
    gang = policy.get("gang") if isinstance(policy, dict) else None
    return gang.get("minCount") if isinstance(gang, dict) else None


@dataclass(frozen=True, slots=True)
class PodGroupKind:
    source: GroupSource
    group: str
    version: str
    plural: str
    size_field: Callable[[dict[str, Any]], Any]

    def size(self, obj: dict[str, Any]) -> int | None:
        """The object's member count, when it states one within bounds."""
        spec = obj.get("spec")
        value = self.size_field(spec) if isinstance(spec, dict) else None
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_GROUP_SIZE:
            return None
        return value


COSCHEDULING = PodGroupKind(GroupSource.COSCHEDULING, "scheduling.x-k8s.io", "v1alpha1", "podgroups", _min_member)
SCHEDULING_GROUP = PodGroupKind(GroupSource.SCHEDULING_GROUP, "scheduling.k8s.io", "v1alpha2", "podgroups",
                                _gang_min_count)
KINDS = (COSCHEDULING, SCHEDULING_GROUP)
