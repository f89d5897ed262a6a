"""The text `kubectl gputopo` prints: kubectl-style tables, and for one node the link matrix exactly as
`gputopo show` prints it (topology/cli.py's render), followed by who holds each GPU and what is still free."""

from __future__ import annotations

from collections.abc import Sequence

from extender.kubectl.views import (
    Delivery,
    FreeSet,
    NodeDetail,
    NodeRow,
    Offer,
    Placement,
    PodReport,
    SIZES,
    Status,
    rfc3339,
)
from topology.cli import render
from topology.fabric import CLIQUE_LABEL, describe

_GAP = "   "  # kubectl's column gap


_GPUS_FROM = {"device-plugin": "the device plugin (the extender picks them)",
              "dra-gpu": "a DRA driver's ResourceSlices (kube-scheduler's DRA plugin picks them, first fit)",
              "compute-domain-only": "the device plugin, beside a ComputeDomain driver's IMEX channels"}


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "") -> str:
    widths = [max(len(row[column]) for row in (header, *rows)) for column in range(len(header))]
    return "\n".join(indent + _GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in (header, *rows))


def nodes_table(rows: Sequence[NodeRow], wide: bool) -> str:
    header = ["NAME", "MODEL", "FREE", *(f"RING-{size}" for size in SIZES), "WHOLE",
              *(["UNHEALTHY", "OBSERVED", "GPUS-FROM"] if wide else []), "DOMAIN", "STATE"]
    lines = []
    for row in rows:
        rings = dict(row.rings)
        extra = [str(row.unhealthy), "-" if row.observed is None else rfc3339(row.observed),
                 row.gpus_from] if wide else []
        lines.append([row.name, row.model or "-", _free(row), *(gbps(rings.get(size)) for size in SIZES),
                      whole_sets(row) or "-", *extra, _domain(row, wide), _state(row)])
    return table(header, lines) if lines else "No GPU nodes found."


def node_text(detail: NodeDetail, wide: bool) -> str:
    row = detail.row
    parts = []
    if detail.topology is not None:
        parts.append(render(f"node {row.name}", detail.topology))
    else:
        parts.append(f"node {row.name}: no topology to show")
    parts.append(f"\nState: {_state(row)}")
    parts.append(f"GPUs from: {_GPUS_FROM[row.gpus_from]}")
    parts.append(f"{describe(row.domain)} (the agent's reading and label {CLIQUE_LABEL}: "
                 f"{detail.label or 'none'}, reconciled)")
    if detail.holders:
        header = ["GPU", "HOLDER", "SOURCE"] + (["UUID"] if wide else [])
        lines = [[str(held.gpu), held.holder or ("(unhealthy)" if held.unhealthy else "-"),
                  held.source.value if held.source else "free"] + ([held.uuid] if wide else [])
                 for held in detail.holders]
        parts.append(f"\nGPUs and their holders ({_free(row)} free)\n" + table(header, lines, "  "))
    if row.free is not None:
        parts.append(f"\nBest free set for each k ({row.free} free)\n" + _free_sets(detail.free_sets))
        parts.append(f"Full-bandwidth sets still whole: {whole_sets(row) or '-'}")
    return "\n".join(parts)


def pod_text(report: PodReport, wide: bool) -> str:
    where = f"on node {report.placement.node}" if report.placement else "not bound to a node"
    lines = [f"Pod {report.namespace}/{report.name} ({report.phase or 'phase unknown'}), {where}",
             f"Request: {_request(report)}"]
    if report.problem:
        lines.append(f"Problem: {report.problem}")
    if report.group is not None:
        group = report.group
        members = ", ".join(f"{member.pod} on {member.node or '(not bound)'}" for member in group.members) or "none"
        lines.append(f"Group: {group.name} ({group.source}; size {group.size or 'from its PodGroup'}, span "
                     f"{group.span}, {'required' if group.required else 'preferred'}); members: {members}")
    if report.placement is not None:
        lines += _placement(report.placement)
    else:
        lines.append("Why it waits: " + (report.failed_scheduling or "no FailedScheduling event yet"))
        lines += ["", "Closest nodes (what each could give it now)", _offers(report.closest)]
    shown = report.events if wide else report.events[-5:]
    if shown:
        lines += ["", "Events" + ("" if wide else " (newest 5; -o wide for all)"),
                  table(["TYPE", "REASON", "FROM", "COUNT", "LAST", "MESSAGE"],
                        [[event.type, event.reason, event.source, str(event.count), event.last or "-", event.message]
                         for event in shown], "  ")]
    return "\n".join(lines)


def gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def whole_sets(row: NodeRow) -> str:
    return " ".join(f"{size}:{count}" for size, count in row.whole)


def _free(row: NodeRow) -> str:
    return f"{'-' if row.free is None else row.free}/{row.total}"


def _state(row: NodeRow) -> str:
    health = row.health
    return health.status.value if health.status is Status.OK else f"{health.status.value}: {health.reason}"


def _domain(row: NodeRow, wide: bool) -> str:
    domain = row.domain
    if domain.name is not None:
        return domain.name
    if domain.problem is None:
        return "-"
    return f"refused: {domain.problem}" if wide else "refused"


def _indices(gpus: Sequence[int]) -> str:
    return ",".join(map(str, gpus)) or "-"


def _free_sets(sets: Sequence[FreeSet]) -> str:
    lines = [[str(found.count), _indices(found.gpus), gbps(found.ring_gbps), found.weakest or "-",
              "-" if found.count == 1 else "yes" if found.full else "no"] for found in sets]
    return table(["K", "GPUS", "RING GB/S", "WEAKEST HOP", "FULL BANDWIDTH"], lines, "  ")


def _request(report: PodReport) -> str:
    parts = [f"{report.gpus} GPU{'' if report.gpus == 1 else 's'}"]
    if report.interconnect:
        parts.append(f"interconnect {report.interconnect}")
    if report.min_bandwidth:
        parts.append(f"min-bandwidth {report.min_bandwidth:g} GB/s")
    parts.append("placement required" if report.required else "placement preferred")
    return ", ".join(parts)


_DELIVERY = {
    Delivery.YES: "yes: the node agent reports exactly these GPUs for the pod",
    Delivery.NO: "NO: the kubelet gave it other GPUs",
    Delivery.NOT_REPORTED: "not yet: the node agent's report does not list the pod (not started yet?)",
    Delivery.UNKNOWN: "unknown: the node has no usable report",
    Delivery.COUNT_ONLY: "bound without a GPU choice (shared node, or kube-scheduler alone): the kubelet chose",
}


def _placement(placement: Placement) -> list[str]:
    lines = [f"GPUs: {_indices(placement.gpus)} ({', '.join(placement.gpu_ids) or 'none chosen'})"
             + ("" if placement.sealed or not placement.gpu_ids else "; unsealed: the extender did not write this")]
    lines += [f"  container {part.name}: {_indices(part.gpus)}" for part in placement.containers]
    written = f" (the extender wrote {placement.ring_annotation})" if placement.ring_annotation else ""
    lines.append(f"Ring: {gbps(placement.ring_gbps)} GB/s{written}")
    delivered = f"; reported: {_indices(placement.delivered)}" if placement.delivered else ""
    lines.append(f"Delivered: {_DELIVERY[placement.delivery]}{delivered}")
    if placement.node_health.status is not Status.OK:
        lines.append(f"Node: {placement.node_health.status.value}: {placement.node_health.reason}")
    return lines


def _offers(offers: Sequence[Offer]) -> str:
    if not offers:
        return "  no usable node (every GPU node is stale, refused, shared, or too small)"
    lines = [[offer.node, f"{offer.free}/{offer.total}", _indices(offer.gpus), gbps(offer.ring_gbps),
              offer.weakest or "-", "yes" if offer.full else "no", "yes" if offer.fits else f"no: {offer.why}"]
             for offer in offers]
    return table(["NODE", "FREE", "BEST SET", "RING GB/S", "WEAKEST HOP", "FULL BANDWIDTH", "MEETS ITS REQUEST"],
                 lines, "  ")
