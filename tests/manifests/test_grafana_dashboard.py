"""scheduler-config/grafana-dashboard.json: every query parses and names only series the extender exports (the
alert rules' check), the panels cover what README's "Metrics and alerts" lists, and Grafana can lay it out."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import orjson
import pytest
from helpers.manifest_checks import CONFIG, assert_promql_on_exported_metrics

DASHBOARD = orjson.loads((CONFIG / "grafana-dashboard.json").read_bytes())
PANELS = [panel for panel in DASHBOARD["panels"] if panel["type"] != "row"]
TARGETS = [(panel["title"], target) for panel in PANELS for target in panel["targets"]]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# What the dashboard is for (issue 19): latency per verb, decisions and refusals, stale and refused nodes, the
# ledger, allocation mismatches, granted ring bandwidth, waits and drains, group plans, domain-refused nodes.
COVERED = {
    "gpu_topology_extender_request_seconds_bucket",
    "gpu_topology_extender_decisions_total",
    "gpu_topology_extender_requests_refused_total",
    "gpu_topology_extender_stale_nodes",
    "gpu_topology_extender_nodes_refused",
    "gpu_topology_extender_ledger_pods",
    "gpu_topology_extender_allocation_mismatches_total",
    "gpu_topology_extender_granted_ring_gbps_bucket",
    "gpu_topology_extender_group_plans",
    "gpu_topology_extender_nodes_domain_refused",
}


@pytest.mark.parametrize(("panel", "target"), TARGETS, ids=[f"{title} {target['refId']}" for title, target in TARGETS])
def test_query_parses_and_names_only_metrics_the_extender_exports(panel: str, target: dict[str, Any]) -> None:
    assert_promql_on_exported_metrics(target["expr"])
    assert target["datasource"] == DATASOURCE, panel


def test_the_panels_cover_every_metric_the_issue_names_and_drains() -> None:
    named = set().union(*(assert_promql_on_exported_metrics(target["expr"]) for _, target in TARGETS))
    assert COVERED <= named, COVERED - named
    assert any('outcome="drain"' in target["expr"] for _, target in TARGETS)


def test_the_datasource_is_a_variable_every_panel_uses() -> None:
    (variable,) = DASHBOARD["templating"]["list"]
    assert (variable["name"], variable["type"], variable["query"]) == ("datasource", "datasource", "prometheus")
    assert all(panel["datasource"] == DATASOURCE for panel in PANELS)


def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping() -> None:
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) and DASHBOARD["uid"] == "gpu-topology-extender"
    boxes = [panel["gridPos"] for panel in DASHBOARD["panels"]]
    assert all(box["x"] >= 0 and box["w"] > 0 and box["x"] + box["w"] <= 24 for box in boxes)
    for a, b in combinations(boxes, 2):
        apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"] or a["y"] + a["h"] <= b["y"]
                 or b["y"] + b["h"] <= a["y"])
        assert apart, (a, b)
    assert all(panel["title"] and panel.get("description") for panel in PANELS)
