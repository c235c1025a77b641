"""The committed dashboards are generated, self-contained, and query only series that exist."""

from __future__ import annotations

import json
import re

import pytest

from observability.build import DASHBOARDS, DASHBOARDS_DIR, PROMETHEUS_RULE_TEMPLATE, generated_files, stale_files
from observability.catalog import defined_series
from observability.dashboards.common import DATASOURCE_VARIABLE
from observability.dashboards.rollout import MULTI_TURN_PANELS, SGLANG_ONLY_PANELS
from observability.queries import alert_rules, dashboard_queries, load_dashboards, panels, referenced_series
from observability.sglang import sglang_series

BOARDS = load_dashboards(DASHBOARDS_DIR)


def test_committed_files_equal_a_fresh_generation() -> None:
    assert stale_files() == [], "run `make dashboards` and commit the result"
    assert {p.name for p in generated_files()} == {*DASHBOARDS, PROMETHEUS_RULE_TEMPLATE.name}


def test_generation_is_deterministic() -> None:
    assert generated_files() == generated_files()


def test_every_required_dashboard_exists_with_a_stable_uid() -> None:
    uids = {board["uid"] for board in BOARDS}
    assert uids == {"relayrl-overview", "relayrl-rollout", "relayrl-trainer", "relayrl-queue", "relayrl-paramsync"}


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b["uid"])
def test_dashboard_uses_the_datasource_variable_and_no_import_inputs(board: dict) -> None:
    text = json.dumps(board)
    assert "${DS_" not in text and "__inputs" not in board
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables[DATASOURCE_VARIABLE]["type"] == "datasource"
    assert variables[DATASOURCE_VARIABLE]["query"] == "prometheus"
    for panel in panels(board):
        refs = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        assert all(ref == {"type": "prometheus", "uid": "${datasource}"} for ref in refs), panel["title"]


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b["uid"])
def test_panels_have_unique_ids_titles_and_queries(board: dict) -> None:
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels(board)]
    assert len(titles) == len(set(titles))
    for panel in panels(board):
        assert panel["targets"], f"{panel['title']} has no query"
        assert panel.get("description"), f"{panel['title']} has no description"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)) and all(ref_ids)


def test_rollout_dashboard_shows_sglang_metrics() -> None:
    rollout = next(b for b in BOARDS if b["uid"] == "relayrl-rollout")
    used = {s for q in dashboard_queries(rollout) for s in referenced_series(q.expr)}
    assert {"sglang:num_running_reqs", "sglang:gen_throughput", "sglang:token_usage"} <= used
    assert set(SGLANG_ONLY_PANELS) <= {p["title"] for p in panels(rollout)}


def test_rollout_dashboard_shows_tool_use_of_episodes() -> None:
    rollout = next(b for b in BOARDS if b["uid"] == "relayrl-rollout")
    by_panel = {
        title: {s for q in dashboard_queries(rollout) if q.panel == title for s in referenced_series(q.expr)}
        for title in MULTI_TURN_PANELS
    }
    assert by_panel == {
        "Tool calls by outcome": {"relayrl_rollout_tool_calls_total"},
        "Tool latency": {"relayrl_rollout_tool_latency_seconds_bucket"},
        "Turns per episode": {"relayrl_rollout_episode_turns_bucket"},
        "Episodes by end reason": {"relayrl_rollout_episodes_total"},
    }
    exprs = {q.panel: q.expr for q in dashboard_queries(rollout)}
    assert "by (tool, outcome)" in exprs["Tool calls by outcome"] and "by (reason)" in exprs["Episodes by end reason"]


def test_every_dashboard_series_is_defined_by_a_service() -> None:
    known = defined_series() | sglang_series()
    unknown = {
        f"{q.dashboard} / {q.panel}: {series}"
        for board in BOARDS
        for q in dashboard_queries(board)
        for series in referenced_series(q.expr)
        if series not in known
    }
    assert not unknown, "dashboards query series no service defines:\n" + "\n".join(sorted(unknown))


def test_every_alert_series_is_defined_by_a_service() -> None:
    known = defined_series()
    unknown = {
        f"{rule.alert}: {series}"
        for rule in alert_rules()
        for series in referenced_series(rule.expr)
        if series not in known
    }
    assert not unknown, "alerts query series no service defines:\n" + "\n".join(sorted(unknown))


def test_every_panel_and_alert_names_at_least_one_series() -> None:
    # A query that names no series would pass the checks above without testing anything.
    for board in BOARDS:
        for q in dashboard_queries(board):
            assert referenced_series(q.expr), f"{q.dashboard} / {q.panel}: {q.expr}"
    for rule in alert_rules():
        assert referenced_series(rule.expr), rule.alert


def test_required_alerts_exist() -> None:
    names = {rule.alert for rule in alert_rules()}
    assert {
        "RelayRLStalenessNearBound",
        "RelayRLQueueFull",
        "RelayRLReplicaLagging",
        "RelayRLTrainerIdle",
        "RelayRLNoTrainingProgress",
        "RelayRLDeadLetterGrowth",
    } <= names


def test_queries_use_only_the_rate_interval_variable() -> None:
    # The Prometheus test substitutes $__rate_interval; any other variable would reach Prometheus raw.
    for board in BOARDS:
        for q in dashboard_queries(board):
            assert set(re.findall(r"\$\{?\w+", q.expr)) <= {"$__rate_interval"}, f"{q.dashboard} / {q.panel}"
