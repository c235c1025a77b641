"""The built-in engine serves LoRA adapters with SGLang's API (a real engine process, the SGLang
client): a loaded adapter gives the log-probs and greedy tokens of the merged model, requests
without ``lora_path`` get the base model, and an unloaded adapter can no longer be named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from relayrl import http_client
from relayrl.net import free_port
from services.engine.client import EngineClient, EngineError, SamplingParams
from services.trainer import lora
from tests.integration.rollout.conftest import EngineProcess

torch.set_num_threads(1)
PROMPT = [5, 6, 7, 8, 9, 10]
GREEDY = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)


def _adapter(model_dir: Path, out: Path, seed: int) -> Path:
    """A peft adapter with random (non-zero) A and B on attention and MLP projections and on the
    output head (tied to the embedding in the tiny model)."""
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj", "lm_head"], init_lora_weights=False
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.mul_(0.5)
    # The head is frozen: its weight is the base model's, which peft would otherwise save beside the adapter.
    model.save_pretrained(out, save_embedding_layers=False)
    return out


def _merged(model_dir: Path, adapter_dir: Path, out: Path) -> Path:
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    lora.merge(PeftModel.from_pretrained(base, str(adapter_dir))).save_pretrained(out)
    return out


def _logprobs(model: torch.nn.Module, prompt: list[int], output: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return [float(logp[i, t]) for i, t in enumerate(output)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    proc = EngineProcess(tiny_model_dir, free_port()).start()
    yield proc
    proc.stop()


async def test_adapter_output_equals_the_merged_model(engine, tiny_model_dir, tmp_path):
    adapter_dir = _adapter(tiny_model_dir, tmp_path / "adapter", seed=1)
    merged = AutoModelForCausalLM.from_pretrained(str(_merged(tiny_model_dir, adapter_dir, tmp_path / "merged")))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    async with EngineClient(engine.url) as client:
        loaded = await client.load_lora_adapter("v1", str(adapter_dir))
        assert loaded.success, loaded.message
        try:
            sampled = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, ignore_eos=True)
            with_adapter = await client.generate(PROMPT, sampled, lora_path="v1")
            without = await client.generate(PROMPT, sampled)
            greedy = (await client.generate(PROMPT, GREEDY, lora_path="v1"))[0]
        finally:
            assert (await client.unload_lora_adapter("v1")).success
    for out in with_adapter:
        expected = _logprobs(merged, PROMPT, out.output_ids)
        assert out.logprobs == pytest.approx(expected, abs=1e-4)
    for out in without:
        assert out.logprobs == pytest.approx(_logprobs(base, PROMPT, out.output_ids), abs=1e-4)
    # the merged directory, loaded with transformers, generates the engine's greedy tokens
    with torch.no_grad():
        generated = merged.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False, min_new_tokens=8)
    assert generated[0, len(PROMPT) :].tolist() == greedy.output_ids
    # the adapter changes the policy (else equality with the merged model would prove nothing)
    assert _logprobs(merged, PROMPT, greedy.output_ids) != pytest.approx(
        _logprobs(base, PROMPT, greedy.output_ids), abs=1e-3
    )


async def test_two_adapters_and_the_base_share_one_batch(engine, tiny_model_dir, tmp_path):
    import asyncio

    dirs = [_adapter(tiny_model_dir, tmp_path / f"a{i}", seed=10 + i) for i in range(2)]
    async with EngineClient(engine.url) as client:
        for i, d in enumerate(dirs):
            assert (await client.load_lora_adapter(f"a{i}", str(d))).success
        alone = [(await client.generate(PROMPT, GREEDY, lora_path=name))[0].output_ids for name in ("a0", "a1", None)]
        together = await asyncio.gather(*(client.generate(PROMPT, GREEDY, lora_path=n) for n in ("a0", "a1", None)))
        info = await client.model_info()
        for i in range(2):
            assert (await client.unload_lora_adapter(f"a{i}")).success
    assert [out[0].output_ids for out in together] == alone
    assert len({tuple(ids) for ids in alone}) == 3
    assert set(info["loaded_lora_adapters"]) == {"a0", "a1"}


async def test_sglang_shapes_of_lora_calls(engine, tiny_model_dir, tmp_path):
    adapter_dir = _adapter(tiny_model_dir, tmp_path / "adapter", seed=3)
    async with http_client.async_client(base_url=engine.url) as http:
        reply = await http.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapter_dir)})
        assert reply.status_code == 200
        assert reply.json() == {"success": True, "error_message": None, "loaded_adapters": {"x": str(adapter_dir)}}
        bad = await http.post("/load_lora_adapter", json={"lora_name": "y", "lora_path": str(tmp_path / "none")})
        assert bad.status_code == 400 and not bad.json()["success"] and "peft" in bad.json()["error_message"]
        version = await http.post("/update_weight_version", json={"new_version": "7", "abort_all_requests": False})
        assert version.status_code == 200 and version.json()["success"]
        assert (await http.get("/get_weight_version")).json()["weight_version"] == "7"
        assert (await http.post("/unload_lora_adapter", json={"lora_name": "x"})).status_code == 200
        gone = await http.post("/generate", json={"input_ids": PROMPT, "lora_path": "x"})
        assert gone.status_code == 400 and "not loaded" in gone.json()["error"]["message"]
        assert (await http.post("/unload_lora_adapter", json={"lora_name": "x"})).status_code == 400
        await http.post("/update_weight_version", json={"new_version": "0", "abort_all_requests": False})
    async with EngineClient(engine.url) as client:
        with pytest.raises(EngineError):
            await client.generate(PROMPT, GREEDY, lora_path="x")
