"""A decode step's host work overlaps the GPU's: from the next prefill to the sampled tokens, nothing
the scheduler launches waits for the device (``torch.cuda.set_sync_debug_mode("error")`` raises at
any operation that synchronises). A copy from pageable memory, a read of a device value or a tensor
built on the device from a list would each make the host wait for every pass in flight, so the host
could not prepare a step while the GPU ran the last one, and the engine's ``device_wait_seconds``
would count that wait as host work. Only the scheduler's one read-back of a step's tokens waits.

Run with ``make test-gpu``; skipped without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from services.engine.device import CudaGraphDecode, kv_pool_for
from services.engine.model_runner import ModelRunner
from services.engine.sampling import SampleFn, SamplingConfig, sampler_named
from tests.unit.engine.models import random_causal_lm

pytestmark = pytest.mark.gpu

# The torch sampler with every setting; the triton one with those it takes itself (a top-k or top-p
# row would send its batch to the torch sampler).
SAMPLERS = {
    "pytorch": [
        SamplingConfig(temperature=0.0),
        SamplingConfig(temperature=0.8, top_k=5),
        SamplingConfig(temperature=1.0, top_p=0.9),
        SamplingConfig(temperature=0.7, top_k=20, top_p=0.5),
    ],
    "triton": [
        SamplingConfig(temperature=0.0),
        SamplingConfig(temperature=0.8),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=1.3),
    ],
}


@pytest.fixture(scope="module", params=["flex_attention", "triton"])
def runner(request: pytest.FixtureRequest) -> Iterator[ModelRunner]:
    model = random_causal_lm().to("cuda")
    pool = kv_pool_for(model, 16, 256, max_total_tokens=8192, cpu_tokens=0, mem_fraction_static=0.9)
    decoder = CudaGraphDecode(max_bs=8, max_blocks_per_seq=16)
    runner = ModelRunner(model, pool, attention=request.param, decoder=decoder)
    runner.warm_up(256)
    decoder.capture_all(runner)
    yield runner
    torch.cuda.synchronize()


@pytest.mark.parametrize("sampling_backend", sorted(SAMPLERS))
def test_prefill_decode_and_sampling_launch_without_waiting_for_the_device(
    runner: ModelRunner, sampling_backend: str
) -> None:
    sample: SampleFn = sampler_named(sampling_backend, torch.device("cuda")).sample
    configs = SAMPLERS[sampling_backend]
    generator = torch.Generator(device="cuda").manual_seed(0)
    prompts = [[3 + i, 5, 7 + i, 11] * (i + 1) for i in range(len(configs))]
    # Once outside the check: the first call of each shape may compile.
    for _ in range(2):
        done = runner.prefill(prompts)
        logits = torch.stack([d.logits for d in done])
        tokens = sample(logits, configs, generator)[0].tolist()
        logits = runner.decode([d.slot for d in done], tokens)
        sample(logits, configs, generator)
        for d in done:
            runner.kv.release(d.slot)
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("error")
    try:
        done = runner.prefill(prompts)
        tokens_B, _ = sample(torch.stack([d.logits for d in done]), configs, generator)
        logits = runner.decode([d.slot for d in done], [7] * len(done))
        tokens_B, logprobs_B = sample(logits, configs, generator)
    finally:
        torch.cuda.set_sync_debug_mode("default")

    assert len(tokens_B.tolist()) == len(configs) and torch.isfinite(logprobs_B).all()
    # The decode step ran from a graph, as in serving.
    assert isinstance(runner.decoder, CudaGraphDecode) and runner.decoder.replays > 0
