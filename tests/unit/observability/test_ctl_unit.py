"""``relayrl ctl``'s settings and its status report, without any server."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from commands.ctl.components import ParamsyncReport, QueueReport, ReplicaReport, TrainerReport
from commands.ctl.config import CtlSettings, env_file_text
from commands.ctl.deployment import DeploymentStatus, Failure, Outcome
from commands.ctl.render import print_outcomes, print_status, summary_line
from relayrl.config import SettingsError, load_settings
from services.paramsync.manifest import ReplicaVersion


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("RELAYRL_"):
            monkeypatch.delenv(name)


def test_rollout_urls_accept_commas_or_a_json_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_CTL_ROLLOUT_URLS", "http://a:1/, http://b:2")
    assert load_settings(CtlSettings).rollout_urls == ["http://a:1", "http://b:2"]
    monkeypatch.setenv("RELAYRL_CTL_ROLLOUT_URLS", '["http://a:1"]')
    assert load_settings(CtlSettings).rollout_urls == ["http://a:1"]


def test_bad_endpoints_are_refused_with_the_variable_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYRL_CTL_QUEUE_ADDRESS", "http://queue:50051/")
    monkeypatch.setenv("RELAYRL_CTL_ROLLOUT_URLS", "rollout:8080")
    with pytest.raises(SettingsError) as err:
        load_settings(CtlSettings)
    assert "RELAYRL_CTL_QUEUE_ADDRESS" in str(err.value) and "RELAYRL_CTL_ROLLOUT_URLS" in str(err.value)


def test_the_shared_token_and_an_env_file_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_file = tmp_path / "ctl.env"
    env_file.write_text(env_file_text("t0k", ["http://r:1", "http://r:2"], "http://t:3", "q:4", "p:5"))
    settings = load_settings(CtlSettings, _env_file=env_file)
    assert settings.api_token.get_secret_value() == "t0k"
    assert settings.rollout_urls == ["http://r:1", "http://r:2"]
    assert (settings.trainer_url, settings.queue_address, settings.paramsync_address) == ("http://t:3", "q:4", "p:5")
    # The environment wins over the file.
    monkeypatch.setenv("RELAYRL_API_TOKEN", "from-env")
    assert load_settings(CtlSettings, _env_file=env_file).api_token.get_secret_value() == "from-env"


def _replica(replica_id: str, version: int, latest: int, paused: bool = False) -> ReplicaReport:
    return ReplicaReport(
        endpoint=f"http://{replica_id}:8080",
        replica_id=replica_id,
        weight_version=version,
        latest_version=latest,
        paused=paused,
        pause_mode="retract" if paused else "",
        in_flight=3,
        leases_held=2,
        tokens_per_s=1500.0,
        samples_per_s=12.5,
        total_generated_samples=400,
        generation_errors=1,
        engine_ready=True,
    )


def _status() -> DeploymentStatus:
    return DeploymentStatus(
        rollout=[_replica("rollout-0", 9, 9), _replica("rollout-1", 6, 9, paused=True)],
        trainer=TrainerReport(
            endpoint="http://t:8080",
            step=42,
            version=9,
            total_steps=100,
            consuming=True,
            checkpoint_requested=False,
            buffered_groups=3,
            unacked_groups=1,
            released_prompts=50,
            param_sync_count=9,
            world_size=2,
        ),
        queue=QueueReport(
            endpoint="q:50051",
            queue_size=5,
            pending=2,
            capacity=64,
            total_produced=300,
            total_consumed=290,
            dropped_by_reason={"stale": 4, "malformed": 0},
            consumer_lag=5,
            avg_sample_age_versions=0.4,
            max_sample_age_versions=1.0,
            avg_sample_age_s=2.0,
            max_sample_age_s=6.0,
            stale_samples_ratio=0.01,
            generated_long_threshold_tokens=48.0,
            generated_long_token_share=0.3,
            duplicate_groups=1,
            prompts_waiting=7,
            prompts_leased=3,
        ),
        paramsync=ParamsyncReport(
            "p:50052",
            9,
            [
                ReplicaVersion("rollout-0", 9, 0.0, 0, "in_sync"),
                ReplicaVersion("rollout-1", 6, 0.0, 3, "lagging", 4, "engine refused the update"),
            ],
        ),
        failures=[Failure("trainer", "GET http://t2:8080/control/status", "unreachable (connection refused)")],
        not_configured=[],
    )


def _render(status: DeploymentStatus, width: int = 160) -> str:
    out = io.StringIO()
    print_status(Console(file=out, width=width, color_system=None), status)
    return out.getvalue()


def test_summary_line_has_versions_staleness_depth_and_throughput() -> None:
    line = summary_line(_status())
    assert "policy v9" in line
    assert "trainer step 42/100 at v9 (consuming)" in line
    assert "queue 5 queued + 2 pending / 64" in line
    assert "staleness mean 0.40 max 1 versions" in line
    assert "25.0 samples/s, 3.0k tokens/s over 2 replicas" in line


def test_status_tables_show_per_replica_lag_and_paramsync_errors() -> None:
    text = _render(_status())
    replicas_table = text.split("Rollout replicas")[1].split("Weight versions")[0]
    (row,) = [line for line in replicas_table.splitlines() if "rollout-1" in line]
    cells = [cell.strip() for cell in row.split("│")[1:-1]]
    # replica, state, version, lag, in flight, leases, tokens/s, samples/s, errors
    assert cells[:4] == ["rollout-1", "paused (retract)", "6", "3"]
    assert cells[6:8] == ["1.5k", "12.5"]
    assert "drops: stale 4" in text and "malformed" not in text.split("drops:")[1].split(";")[0]
    assert "stale 4; 1 duplicate(s)" in text
    assert "lagging" in text and "engine refused the update" in text


def test_errors_are_printed_whole_even_on_a_narrow_terminal() -> None:
    text = _render(_status(), width=60)
    assert "✗ trainer: GET http://t2:8080/control/status: unreachable (connection refused)" in text


def test_outcomes_read_as_one_line_each() -> None:
    out = io.StringIO()
    print_outcomes(
        Console(file=out, width=40, color_system=None),
        [
            Outcome("trainer", "http://t:8080", True, "stopped consuming after the current step"),
            Outcome(
                "rollout", "POST http://r:8080/control/pause", False, "401 Unauthorized: the API token was refused"
            ),
        ],
    )
    lines = out.getvalue().splitlines()
    assert lines == [
        "✓ trainer http://t:8080: stopped consuming after the current step",
        "✗ rollout POST http://r:8080/control/pause: 401 Unauthorized: the API token was refused",
    ]
