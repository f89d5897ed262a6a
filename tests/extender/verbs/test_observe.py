"""--observe (extender/verbs/service.py): prioritize scores as when enforcing; filter passes every candidate and
counts what it would have refused; preempt keeps every node; bind is refused, with no Binding and no reservation;
nothing is held (no group plan, no shortlist)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from extender.api.wire import BindingArgs, ExtenderArgs, PreemptionArgs, Victims
from extender.verbs.service import OBSERVE_ONLY, OBSERVED_DROP, OBSERVED_REFUSAL, ExtenderService
from helpers.reported_nodes import reported_cluster

# Busy boards, so that some nodes cannot serve 4 GPUs and some give less than a full-bandwidth set.
NODES = {"full": ("dgx-h100", (0, 1, 2, 3, 4, 5, 6)), "half": ("dgx1-v100", (0, 1, 2, 3)),
         "pairs": ("rtx-a6000-pairs", (0, 2, 4)), "free": ("dgx-h100", ()), "free2": ("hgx-a100-8gpu", ()),
         "v100": ("dgx1-v100", ())}
NAMES = sorted(NODES)
CLIQUE = "nvidia.com/gpu.clique"


class NoBinding:
    """The API as observing must leave it: never asked to bind or to read a pod for a bind."""

    def bind(self, *args: Any) -> None:
        raise AssertionError("observing posted a Binding")

    def bind_soon(self, *args: Any) -> None:
        raise AssertionError("observing posted a Binding")

    def get_pod(self, *args: Any) -> None:
        raise AssertionError("observing read a pod to bind it")

    def emit_event(self, *args: Any, **kwargs: Any) -> None:
        pass


def _pod(uid: str, gpus: int, annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1",
                         "annotations": dict(annotations or {})},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _service(*, observe: bool, shortlist: int = 0, **kwargs: Any) -> ExtenderService:
    return ExtenderService(reported_cluster(NODES), NoBinding(), observe=observe,  # type: ignore[arg-type]
                           shortlist=shortlist, topology_wait=600.0, **kwargs)


def _decisions(service: ExtenderService, verb: str, outcome: str) -> float:
    return service.metrics.registry.get_sample_value("gpu_topology_extender_decisions_total",
                                                     {"verb": verb, "outcome": outcome}) or 0.0


def test_filter_passes_every_node_and_counts_what_it_would_refuse() -> None:
    enforcing, observing = _service(observe=False), _service(observe=True, shortlist=1)
    pod = _pod("p", 4)
    refused = enforcing.filter(ExtenderArgs(pod, NAMES, None))
    would = sum(map(len, refused.failed.values())) + sum(map(len, refused.unresolvable.values()))
    assert would > 0 and len(refused.passed) > 1  # more fits than the shortlist of 1, and refusals to count
    seen = observing.filter(ExtenderArgs(pod, NAMES, None))
    assert seen.passed == NAMES and not seen.failed and not seen.unresolvable  # no shortlist either
    assert _decisions(observing, "filter", OBSERVED_REFUSAL) == would
    assert _decisions(observing, "filter", "pass") == len(refused.passed)
    assert _decisions(observing, "filter", "fail") == _decisions(observing, "filter", "outranked") == 0


def test_prioritize_scores_as_when_enforcing() -> None:
    enforcing, observing = _service(observe=False), _service(observe=True)
    for gpus in (1, 2, 4, 8):
        pod = _pod(f"p{gpus}", gpus)
        observing.filter(ExtenderArgs(pod, NAMES, None))
        assert observing.prioritize(ExtenderArgs(pod, NAMES, None)) == enforcing.prioritize(
            ExtenderArgs(pod, NAMES, None))


def test_bind_is_refused_without_a_binding_or_a_reservation() -> None:
    service = _service(observe=True)
    args = BindingArgs("p", "ml", "p", "free")
    assert "observes only (--observe)" in service.bind(args)

    async def soon() -> str:
        answer = service.bind_soon(args, None)  # type: ignore[arg-type]
        assert answer is not None
        return await answer
    assert "observes only (--observe)" in asyncio.run(soon())
    assert _decisions(service, "bind", OBSERVE_ONLY) == 2
    assert len(service.state.ledger) == 0


def test_preempt_keeps_every_node() -> None:
    victims = {name: Victims([], 0) for name in NAMES}  # evicting no one frees no GPU
    dropped = len(victims) - len(_service(observe=False).preempt(PreemptionArgs(_pod("p", 8), victims)))
    service = _service(observe=True)
    assert dropped > 0 and service.preempt(PreemptionArgs(_pod("p", 8), victims)) == victims
    assert _decisions(service, "preempt", OBSERVED_DROP) == dropped


def test_a_group_member_holds_nothing() -> None:
    trays = {f"t{index}": ("gb200-node", ()) for index in range(4)}
    labels = {name: {CLIQUE: "9c6f5af3-53bf-49b5-a436-b66766c413c3.1"} for name in trays}
    service = ExtenderService(reported_cluster(trays, labels=labels), NoBinding(),  # type: ignore[arg-type]
                              observe=True)
    member = _pod("w0", 4, {"gpu-topology.io/group": "train", "gpu-topology.io/group-size": "2"})
    assert service.filter(ExtenderArgs(member, sorted(trays), None)).passed == sorted(trays)
    names, scores = service.prioritize(ExtenderArgs(member, sorted(trays), None))
    assert names == sorted(trays) and len(scores) == len(trays)
    assert len(service.plans) == 0 and len(service.state.ledger) == 0


def test_observing_pins_no_claim() -> None:
    with pytest.raises(ValueError, match="--observe pins no claim"):
        _service(observe=True, pin_claims=True)
