"""The dashboards and alerts against real software: the local stack (``relayrl up``'s
components) scraped every second by a real ``prometheus`` server, for a few training steps.

Every panel query of every dashboard and every alert expression must evaluate without error
through Prometheus' HTTP API, and every panel must return data. The exceptions are the
panels fed by SGLang alone (``SGLANG_ONLY_PANELS``): the built-in CPU engine has no KV cache
pool to report, so on this machine they must evaluate but cannot have data; and the panels fed
by multi-turn episodes (``MULTI_TURN_PANELS``), which this single-turn stack does not run (their
series are read from a real rollout's ``/metrics`` in tests/integration/rollout/test_agent_tool_metrics.py);
and the trainer's panels fed only on CUDA (``GPU_ONLY_PANELS``: MFU and peak device memory).

``relayrl ctl`` is checked against the same stack: ``status --all`` names every component,
and pause/resume reach every rollout replica and the trainer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import SecretStr

from commands.ctl.config import CtlSettings, env_file_text
from commands.ctl.deployment import act, gather_status
from commands.stack.config import StackConfig, StackSettings
from commands.stack.launch import LocalStack, prepare_model
from commands.stack.supervisor import supervised
from observability.alerts.chart import RULES_FILE
from observability.build import DASHBOARDS_DIR
from observability.dashboards.rollout import MULTI_TURN_PANELS, SGLANG_ONLY_PANELS
from observability.dashboards.trainer import GPU_ONLY_PANELS
from observability.queries import alert_rules, dashboard_queries, load_dashboards, panels
from tests.integration.observability.prometheus import (
    RATE_INTERVAL,
    SCRAPE_INTERVAL_S,
    PrometheusServer,
    grafana_to_promql,
)
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
STEPS_BEFORE_CHECKING = 3
# How far back each panel query looks, as a dashboard opened now would.
WINDOW_S = 60
# Successful scrapes of every component within one rate window before any panel is checked.
RATE_SAMPLES = 3


@dataclass
class Observed:
    stack: LocalStack
    prometheus: PrometheusServer


def _config(runs_dir: Path) -> StackConfig:
    # Small and quick: one replica, one trainer rank, short responses; enough steps to outlast the test.
    # Dynamic sampling keeps only groups whose rewards differ, which an untrained model's rarely do:
    # 8 samples a group make such groups about 4 times as common as 2 did, for little more work
    # (one request per group), and the first steps come in seconds instead of a minute.
    return StackConfig(
        stack=StackSettings(run_id="observability", runs_dir=runs_dir, rollout_replicas=1, trainer_procs=1),
        trainer={
            "dataset": "builtin:copy",
            "dataset_difficulty": 1,
            "n_samples": 8,
            "batch_size": 2,
            "max_new_tokens": 4,
            "total_steps": 1000,
            "sync_every": 1,
            # The recipe panels need their metrics: mismatch metrics (weights not applied) and
            # dynamic sampling.
            "rollout_is_threshold": 2.0,
            "filter_groups_enable": True,
        },
        rollout={"max_new_tokens": 4, "max_inflight_prompts": 4},
        queue={"stats_refresh_s": 0.5},
    )


def _wait_for_steps(prometheus: PrometheusServer, stack: LocalStack, steps: int, timeout_s: float) -> None:
    """Until Prometheus has watched the trainer take ``steps`` steps and has scraped every component
    at least RATE_SAMPLES times within one rate window. The trainer may be past any given step by
    Prometheus' first scrape, and a rate needs two samples in its window: a panel checked right
    after that first scrape has no rate to show."""
    first: list[float] = []

    def reached() -> bool:
        stack.supervisor.check_alive()
        result = prometheus.query("max(relayrl_trainer_global_steps)")
        if not result.series:
            return False
        step = float(result.series[0]["value"][1])
        if not first:
            first.append(step)
        scrapes = prometheus.query(f"min(sum_over_time(up[{RATE_INTERVAL}]))").series
        return step >= first[0] + steps and bool(scrapes) and float(scrapes[0]["value"][1]) >= RATE_SAMPLES

    # One poll a second: Prometheus scrapes no faster.
    wait_until(
        reached,
        timeout_s,
        f"Prometheus to watch the trainer take {steps} steps (logs in {stack.run_dir})",
        poll_s=SCRAPE_INTERVAL_S,
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("observed-stack")
    with (work / "stack.log").open("w") as sink, supervised(sink) as supervisor:
        stack = LocalStack(_config(work / "runs"), supervisor)
        stack.start(prepare_model(stack))
        targets = {name: [url.removeprefix("http://")] for name, url in stack.endpoints.http_services().items()}
        prometheus = PrometheusServer(work / "prometheus", targets, rule_files=[RULES_FILE]).start()
        try:
            _wait_for_steps(prometheus, stack, STEPS_BEFORE_CHECKING, timeout_s=120)
            yield Observed(stack, prometheus)
        finally:
            prometheus.stop()


def test_prometheus_scrapes_every_component(observed: Observed) -> None:
    targets = observed.prometheus.targets()
    jobs = {t["labels"]["job"]: t for t in targets}
    assert set(jobs) == set(observed.stack.endpoints.http_services())
    unhealthy = {job: t.get("lastError") for job, t in jobs.items() if t["health"] != "up"}
    assert not unhealthy


def test_every_panel_query_evaluates_and_every_panel_has_data(observed: Observed) -> None:
    failures = []
    for board in load_dashboards(DASHBOARDS_DIR):
        queries = dashboard_queries(board)
        for panel in panels(board):
            with_data = 0
            for query in (q for q in queries if q.panel == panel["title"]):
                try:
                    result = observed.prometheus.query_range(grafana_to_promql(query.expr), WINDOW_S)
                except Exception as exc:
                    failures.append(f"{board['uid']} / {panel['title']} {query.ref_id}: {exc}")
                    continue
                with_data += result.has_data
            exempt = {"relayrl-rollout": (*SGLANG_ONLY_PANELS, *MULTI_TURN_PANELS), "relayrl-trainer": GPU_ONLY_PANELS}
            needs_data = panel["title"] not in exempt.get(board["uid"], ())
            if needs_data and not with_data:
                failures.append(f"{board['uid']} / {panel['title']}: no data")
    assert not failures, "\n".join(failures)


def test_every_alert_expression_evaluates(observed: Observed) -> None:
    for rule in alert_rules():
        observed.prometheus.query(rule.expr)  # raises on an evaluation error
    # Prometheus itself evaluated the loaded rules without error, and none fires on a healthy run.
    loaded = observed.prometheus.rules()
    assert {r["name"] for r in loaded} == {r.alert for r in alert_rules()}
    assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]
    assert [r["name"] for r in loaded if r["state"] == "firing"] == []


def _ctl_settings(stack: LocalStack) -> CtlSettings:
    e = stack.endpoints
    return CtlSettings(
        api_token=SecretStr(stack.api_token),
        rollout_urls=e.rollouts_http,
        trainer_url=e.trainer_http,
        queue_address=e.queue_grpc,
        paramsync_address=e.paramsync_grpc,
    )


def test_ctl_status_all_prints_every_component(observed: Observed, tmp_path: Path) -> None:
    settings = _ctl_settings(observed.stack)
    env_file = tmp_path / "ctl.env"
    env_file.write_text(
        env_file_text(
            observed.stack.api_token,
            settings.rollout_urls,
            settings.trainer_url,
            settings.queue_address,
            settings.paramsync_address,
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYRL_")} | {"COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "ctl", "--env-file", str(env_file), "status", "--all"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("rollout rollout-0", "trainer", "queue", "paramsync", "Rollout replicas", "samples/s"):
        assert name in done.stdout
    status = gather_status(settings)
    assert status.failures == [] and status.not_configured == []
    assert status.trainer is not None and status.trainer.step >= STEPS_BEFORE_CHECKING
    assert status.paramsync is not None and status.paramsync.latest_version >= 1
    assert [r.replica_id for r in status.rollout] == ["rollout-0"]


def test_ctl_pause_and_resume_reach_every_replica_and_the_trainer(observed: Observed) -> None:
    settings = _ctl_settings(observed.stack)
    paused = act(settings, "pause", ["rollout", "trainer"], mode="retract")
    assert [o.component for o in paused] == ["rollout", "trainer"] and all(o.ok for o in paused), paused
    status = gather_status(settings, ["rollout", "trainer"])
    assert all(r.paused and r.pause_mode == "retract" for r in status.rollout)
    assert status.trainer is not None and status.trainer.consuming is False
    resumed = act(settings, "resume", ["rollout", "trainer"])
    assert all(o.ok for o in resumed), resumed
    status = gather_status(settings, ["rollout", "trainer"])
    assert not any(r.paused for r in status.rollout)
    assert status.trainer is not None and status.trainer.consuming is True
