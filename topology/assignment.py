"""The per-container GPU assignment the extender writes on a pod at bind and the node agent delivers.

`gpu-topology.io/containers` is a JSON object from container name to the GPU ids (UUIDs, or `GPU<index>`)
that container gets, in the kubelet's allocation order: `{"prep":["GPU-a"],"train":["GPU-a","GPU-b"]}`.
Only containers that request GPUs appear. Both sides decode it strictly, within bounds that real pods and
nodes stay far below, because anyone who can edit the pod can edit the annotation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import orjson

from topology import bounds

CONTAINERS_MAX_BYTES = 16 * 1024
MAX_CONTAINERS = 64
MAX_GPUS_PER_CONTAINER = bounds.MAX_GPUS  # no container gets more GPUs than a node may have
GPU_ID_MAX = bounds.MAX_ID_LENGTH  # the longest GPU id a node may publish
_CONTAINER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a DNS label, as the API requires
_GPU_ID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.:]*$")

ContainerGpus = tuple[tuple[str, tuple[str, ...]], ...]  # (container name, GPU ids) in allocation order


class AssignmentError(ValueError):
    """An assignment annotation that cannot be trusted, with the reason."""


def encode_containers(parts: Sequence[tuple[str, Sequence[str]]]) -> str:
    return orjson.dumps({name: list(gpus) for name, gpus in parts}).decode()


def decode_containers(text: str) -> ContainerGpus:
    if not isinstance(text, str) or len(text) > CONTAINERS_MAX_BYTES:
        raise AssignmentError(f"longer than {CONTAINERS_MAX_BYTES} bytes" if isinstance(text, str) else "not text")
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise AssignmentError("not JSON") from None
    if not isinstance(document, dict) or not document:
        raise AssignmentError("expected a non-empty object from container name to GPU ids")
    if len(document) > MAX_CONTAINERS:
        raise AssignmentError(f"{len(document)} containers; at most {MAX_CONTAINERS}")
    parts = []
    for name, gpus in document.items():
        if not _CONTAINER_NAME.match(name):
            raise AssignmentError(f"{name[:70]!r} is not a container name")
        if not isinstance(gpus, list) or not 1 <= len(gpus) <= MAX_GPUS_PER_CONTAINER:
            raise AssignmentError(f"container {name}: expected a list of 1 to {MAX_GPUS_PER_CONTAINER} GPU ids")
        for gpu in gpus:
            if not isinstance(gpu, str) or len(gpu) > GPU_ID_MAX or not _GPU_ID.match(gpu):
                raise AssignmentError(f"container {name}: {str(gpu)[:70]!r} is not a GPU id")
        if len(set(gpus)) != len(gpus):
            raise AssignmentError(f"container {name}: a GPU is listed twice")
        parts.append((name, tuple(gpus)))
    return tuple(parts)
