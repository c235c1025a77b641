"""An engine restarted while the rollout serves a LoRA adapter version (issue #23): the replica
loads the adapter into the new engine before it generates again, so no request names an adapter
the engine does not hold (an HTTP 400) and the samples are the adapter's, not the base model's."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from relayrl.redis_process import RedisProcess
from services.engine.client import EngineClient, SamplingParams
from services.paramsync.client import ParamSyncClient
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from services.rollout.replica import Replica
from services.trainer.lora import adapter_items
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import (
    paramsync_service,
    prompt,
    pull_groups,
    running_replica,
    sample_value,
)
from tests.waiting import wait_until_async

LORA_ALPHA = 8.0
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0)


def _adapter_version(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The tensors a LoRA trainer publishes as a version: peft's names, random non-zero A and B."""
    torch.manual_seed(seed)
    config = LoraConfig(
        r=4, lora_alpha=LORA_ALPHA, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False
    )
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(model_dir)), config)
    return {name: p.detach().clone() for name, p in adapter_items(model)}


def _waiting_for_engine(replica: Replica) -> bool:
    return sample_value(replica, "stalled_seconds", waiting_for="a ready engine", peer="engine") > 0


async def test_restarted_engine_gets_the_adapter_back_before_generating(
    start_engine: Callable[..., EngineProcess],
    redis_server: RedisProcess,
    run_id: str,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    engine = start_engine()
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    prompt_ids = prompt(0).prompt_token_ids
    try:
        async with (
            paramsync_service() as paramsync_address,
            ParamSyncClient(paramsync_address) as paramsync,
            EngineClient(engine.url) as client,
            QueueClient(queue.grpc_address) as q,
            running_replica(
                engine.url,
                queue.grpc_address,
                paramsync_address=paramsync_address,
                weights_dir=str(tmp_path / "w"),
                lora_alpha=LORA_ALPHA,
                temperature=0.0,
            ) as replica,
        ):
            await wait_until_async(replica.state.ready, what="engine ready")
            await paramsync.publish(1, _adapter_version(tiny_model_dir, seed=1))
            await wait_until_async(lambda: replica.state.held_version == 1, what="adapter version 1 held")
            adapter_out = (await client.generate(prompt_ids, GREEDY, lora_path="relayrl-v1"))[0].output_ids
            base_out = (await client.generate(prompt_ids, GREEDY))[0].output_ids

            engine.kill()
            await wait_until_async(lambda: not replica.state.ready(), what="replica not ready")
            # Released once the loop waits for a ready engine (no lease call in flight): the
            # replica leases the prompt the moment it calls the new engine ready.
            await wait_until_async(lambda: _waiting_for_engine(replica), what="the loop waiting for the engine")
            errors_before = replica.state.status().generation_errors
            await q.release([prompt(0, n=2)])
            await asyncio.to_thread(start_engine, engine.port)
            groups = await pull_groups(queue.grpc_address, 1, timeout_s=60)
            errors_after = replica.state.status().generation_errors
            stats = await q.prompt_stats()
            engine_version = await client.weight_version()
            loaded = (await client.model_info())["loaded_lora_adapters"]
    finally:
        await queue.stop()
    # The adapter changes the policy, else equal outputs would prove nothing.
    assert adapter_out != base_out
    assert [s.response_token_ids for s in groups[0].samples] == [adapter_out, adapter_out]
    assert groups[0].samples[0].policy_versions == [1] * len(adapter_out)
    # Not one generation failed: no request named an adapter the new engine did not hold.
    assert errors_after == errors_before
    assert not stats.abandoned_by_reason.get("generation_error")
    assert engine_version == "1" and list(loaded) == ["relayrl-v1"]
