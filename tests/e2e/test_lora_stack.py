"""The whole stack training a LoRA adapter, scored by a reward model: every version paramsync holds
is the adapter alone, the engine generates with the adapter its rollout loaded, its weight version
moving with it; the stack starts the reward service before the rollout, and the rollout scores
every sample with it. One run proves both: a run costs CI more than either check."""

import asyncio
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from relayrl import http_client
from services.paramsync.client import ParamSyncClient
from tests.e2e.conftest import running_stack, small_run, training_rows, wait_for_trainer
from tests.waiting import wait_until

STEPS = 3


def _metric(url: str, name: str) -> float:
    for family in text_string_to_metric_families(http_client.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


def _weight_version(engine: str) -> int:
    return int(http_client.get(f"{engine}/get_weight_version", timeout=5).json()["weight_version"])


async def _tensor_names(address: str, version: int) -> set[str]:
    async with ParamSyncClient(address) as client:
        return set(await client.fetch(version))


def _loaded_adapters(engine: str) -> dict[str, str]:
    return http_client.get(f"{engine}/get_model_info", timeout=5).json()["loaded_lora_adapters"]


def test_a_lora_run_scored_by_a_reward_model_publishes_adapters_the_engine_serves(
    runs_dir: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from relayrl.models.tiny import init_tiny, preset_spec

    lora = {"lora_rank": 4, "lora_alpha": 8, "target_modules": "q_proj,v_proj,lm_head"}
    config = small_run(runs_dir, tiny_model_dir, max_staleness=1, total_steps=STEPS, **lora)
    config.rollout["lora_alpha"] = 8
    config.paramsync["keep_versions"] = STEPS  # every version stays to be looked at
    config.reward = {"model_path": str(init_tiny(tmp_path / "tiny-rm", preset_spec("tiny-rm")))}
    with running_stack(config) as stack:
        assert stack.endpoints.reward_http
        assert wait_for_trainer(stack, timeout_s=240) == 0
        engine, rollout = stack.endpoints.engines[0], stack.endpoints.rollouts_http[0]
        # The rollout loads the last version after the trainer has exited.
        wait_until(lambda: _weight_version(engine) == STEPS, 60, f"the engine to serve version {STEPS}")
        # The adapters before the last two are unloaded right after the switch is reported.
        wait_until(lambda: len(_loaded_adapters(engine)) <= 2, 10, "the engine to unload the older adapters")
        loaded = _loaded_adapters(engine)
        lora_samples = _metric(engine, "relayrl_engine_lora_requests_total")
        names = [asyncio.run(_tensor_names(stack.endpoints.paramsync_grpc, v)) for v in range(1, STEPS + 1)]
        # Generated before scored: a sample is scored before it counts as generated, so this order
        # reads no sample as generated and unscored.
        generated = _metric(rollout, "relayrl_rollout_total_generated_samples_total")
        scored = _metric(stack.endpoints.reward_http, "relayrl_reward_items_scored_total")
        calls = _metric(rollout, "relayrl_rollout_reward_service_latency_seconds_count")
    assert len(training_rows(stack)) == STEPS
    for version_names in names:
        assert version_names and all(".lora_A." in n or ".lora_B." in n for n in version_names), version_names
        assert any("lm_head.lora_B" in n for n in version_names)
    # The engine holds the newest adapter (and the one before, for requests still using it).
    assert f"relayrl-v{STEPS}" in loaded and len(loaded) <= 2, loaded
    # Step 3 trains at version 2 with η = 1: its samples were generated with an adapter.
    assert lora_samples > 0
    # Every generated sample was scored by the reward model, one /score call per group of 4.
    assert generated > 0 and scored >= generated and calls >= generated / 4
