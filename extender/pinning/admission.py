"""At a pod's creation, which of its claim templates the planner will make pinned, and under what names.

A pod that names a ResourceClaimTemplate gets its claim from kube-controller-manager at once, unpinned, and a
claim's spec cannot change afterwards. So the webhook turns each template the planner can pin (whole GPUs of our
classes and nothing else, `DraInventory.whole_gpus`) into a claim name, and records the template in the pod's
`claim-templates` annotation; kube-scheduler holds the pod (its DRA plugin finds no such claim) until the
planner (extender/pinning/planner.py) makes the claim. The pod's name may not exist yet (generateName is
resolved after admission), so the claim's name is the controller's pattern with a random suffix. Members of a
group are left alone: their node choice is the group plan's, made at their filter (extender/verbs/group_placement.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from extender.api.admission import PodReview
from extender.cache.cluster_state import ClusterState
from extender.cache.dra_inventory import DraInventory
from topology import bounds
from topology.annotations import AnnotationKeys

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's generateName suffix letters
_BASE = 57  # the resourceclaim controller's longest base: 63 less a hyphen and 5 letters


def suffix() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(5))


def admit(state: ClusterState, review: PodReview) -> list[dict[str, Any]]:
    """The JSON patch for a pod being created, from the inventory as it stands (read under the ledger lock)."""
    with state.ledger.lock:
        return name_claims(review, state.dra, state.keys)


def name_claims(review: PodReview, inventory: DraInventory, keys: AnnotationKeys,
                token: Callable[[], str] = suffix) -> list[dict[str, Any]]:
    """The JSON patch for the pod: each pinnable template reference turned into a claim name, and the annotation
    saying which template each came from; [] when there is none (or the pod is not a new, unbound pod)."""
    pod = review.pod
    metadata, spec = pod.get("metadata"), pod.get("spec")
    if not review.creating or not isinstance(metadata, dict) or not isinstance(spec, dict) or spec.get("nodeName"):
        return []
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict) and (keys.group in annotations or keys.claim_templates in annotations):
        return []
    claims = spec.get("resourceClaims")
    if not isinstance(claims, list) or len(claims) > bounds.MAX_POD_CLAIMS:
        return []
    base = str(metadata.get("name") or metadata.get("generateName") or "pod").rstrip("-")
    patch: list[dict[str, Any]] = []
    made: list[str] = []
    for i, claim in enumerate(claims):
        name = claim.get("name") if isinstance(claim, dict) else None
        template_name = claim.get("resourceClaimTemplateName") if isinstance(claim, dict) else None
        if not isinstance(name, str) or not isinstance(template_name, str):
            continue
        template = inventory.template(review.namespace, template_name)
        if template is None or not inventory.whole_gpus(template):
            continue
        patch.append({"op": "replace", "path": f"/spec/resourceClaims/{i}",
                      "value": {"name": name, "resourceClaimName": f"{_base(base, name)}-{token()}"}})
        made.append(f"{name}={template_name}")
    if not patch:
        return []
    value = ",".join(made)
    if isinstance(annotations, Mapping):
        patch.append({"op": "add", "path": f"/metadata/annotations/{_pointer(keys.claim_templates)}", "value": value})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {keys.claim_templates: value}})
    return patch


def _base(pod: str, claim: str) -> str:
    """`<pod>-<claim>`, both cut in proportion to their length, as the resourceclaim controller does."""
    joined = f"{pod}-{claim}"
    if len(joined) <= _BASE:
        return joined
    return f"{pod[:len(pod) * _BASE // len(joined)]}-{claim[:len(claim) * _BASE // len(joined)]}".rstrip("-")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
