"""The whole stack training a LoRA adapter: every version paramsync holds is the adapter alone,
and the engine generates with the adapter its rollout loaded, its weight version moving with it."""

import asyncio
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.paramsync.client import ParamSyncClient
from tests.e2e.conftest import running_stack, small_run, training_rows, wait_for_trainer
from tests.waiting import wait_until

STEPS = 3


def _metric(url: str, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=5).text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    return 0.0


def _weight_version(engine: str) -> int:
    return int(httpx.get(f"{engine}/get_weight_version", timeout=5).json()["weight_version"])


async def _tensor_names(address: str, version: int) -> set[str]:
    async with ParamSyncClient(address) as client:
        return set(await client.fetch(version))


def _loaded_adapters(engine: str) -> dict[str, str]:
    return httpx.get(f"{engine}/get_model_info", timeout=5).json()["loaded_lora_adapters"]


def test_a_lora_run_publishes_adapters_and_the_engine_serves_them(runs_dir: Path, tiny_model_dir: Path) -> None:
    lora = {"lora_rank": 4, "lora_alpha": 8, "target_modules": "q_proj,v_proj,lm_head"}
    config = small_run(runs_dir, tiny_model_dir, max_staleness=1, total_steps=STEPS, **lora)
    config.rollout["lora_alpha"] = 8
    config.paramsync["keep_versions"] = STEPS  # every version stays to be looked at
    with running_stack(config) as stack:
        assert wait_for_trainer(stack, timeout_s=120) == 0
        engine = stack.endpoints.engines[0]
        # The rollout loads the last version after the trainer has exited.
        wait_until(lambda: _weight_version(engine) == STEPS, 60, f"the engine to serve version {STEPS}")
        # The adapters before the last two are unloaded right after the switch is reported.
        wait_until(lambda: len(_loaded_adapters(engine)) <= 2, 10, "the engine to unload the older adapters")
        loaded = _loaded_adapters(engine)
        lora_samples = _metric(engine, "relayrl_engine_lora_requests_total")
        names = [asyncio.run(_tensor_names(stack.endpoints.paramsync_grpc, v)) for v in range(1, STEPS + 1)]
    assert len(training_rows(stack)) == STEPS
    for version_names in names:
        assert version_names and all(".lora_A." in n or ".lora_B." in n for n in version_names), version_names
        assert any("lm_head.lora_B" in n for n in version_names)
    # The engine holds the newest adapter (and the one before, for requests still using it).
    assert f"relayrl-v{STEPS}" in loaded and len(loaded) <= 2, loaded
    # Step 3 trains at version 2 with η = 1: its samples were generated with an adapter.
    assert lora_samples > 0
