"""The whole stack with a reward model: the stack starts the reward service before the rollout,
the rollout scores every sample with it, and the run trains to its last step."""

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import running_stack, small_run, training_rows, wait_for_trainer


def _value(url: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_a_run_scored_by_the_reward_service(runs_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from relayrl.models.tiny import init_tiny, preset_spec

    rm_dir = init_tiny(tmp_path / "tiny-rm", preset_spec("tiny-rm"))
    config = small_run(runs_dir, tiny_model_dir, max_staleness=1, total_steps=4)
    config.reward = {"model_path": str(rm_dir)}
    with running_stack(config) as stack:
        assert stack.endpoints.reward_http
        assert wait_for_trainer(stack, timeout_s=240) == 0
        rollout = stack.endpoints.rollouts_http[0]
        scored = _value(stack.endpoints.reward_http, "relayrl_reward_items_scored_total")
        generated = _value(rollout, "relayrl_rollout_total_generated_samples_total")
        calls = _value(rollout, "relayrl_rollout_reward_service_latency_seconds_count")
    assert len(training_rows(stack)) == 4
    # Every generated sample was scored by the reward model, one /score call per group of 4.
    assert generated > 0 and scored >= generated and calls >= generated / 4
