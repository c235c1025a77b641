"""A LoRA trainer as a service (two FSDP2 ranks, real queue and paramsync): versions are the
adapter alone, a restart resumes from the LoRA checkpoint, and `relayrl export` writes the
adapter in peft's format or merged into the base."""

from __future__ import annotations

import uuid

import torch
import yaml
from peft import PeftModel, get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from commands.stack.export import export_policy
from relayrl.models.loading import load_causal_lm
from services.trainer import lora
from tests.integration.trainer.harness import Stack, start_trainer, stop_group
from tests.integration.trainer.test_service import SMALL, _rows

LORA = dict(lora_rank=4, lora_alpha=8, target_modules="q_proj,v_proj,down_proj", use_kl_loss=True, **SMALL)


def _adapter_names(model_dir) -> set[str]:
    spec = lora.LoraSpec(4, 8, ["q_proj", "v_proj", "down_proj"])
    return set(get_peft_model_state_dict(lora.add_adapter(load_causal_lm(model_dir), spec)))


def _train(stack: Stack, model_dir, run_dir, log, total_steps: int) -> None:
    env = stack.trainer_env(model_dir, run_dir, total_steps=total_steps, save_freq=2, **LORA)
    proc = start_trainer(env, log, nproc=2)
    try:
        assert proc.wait(180) == 0, log.read_text()[-3000:]
    finally:
        stop_group(proc)


def test_lora_versions_checkpoints_and_export(redis_server, tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    log = tmp_path / "trainer.log"
    with Stack(redis_server.url, f"t{uuid.uuid4().hex[:6]}") as stack:
        _train(stack, tiny_model_dir, run_dir, log, total_steps=2)
        assert stack.latest_version() == 2
        manifest = stack.paramsync.store.get(2).manifest
        assert {t.name for t in manifest.tensors} == _adapter_names(tiny_model_dir)
        # a restart resumes at step 2 from the LoRA checkpoint and trains on
        _train(stack, tiny_model_dir, run_dir, log, total_steps=4)
        rows = _rows(run_dir)
        assert [r["trainer/global_steps"] for r in rows] == [1, 2, 3, 4]
        assert stack.latest_version() == 4
        v4 = stack.paramsync.store.get(4).manifest
        assert {t.name for t in v4.tensors} == _adapter_names(tiny_model_dir)

    (run_dir / "config.yaml").write_text(yaml.safe_dump({"stack": {"model_dir": str(tiny_model_dir)}}))
    adapter_dir, merged_dir = tmp_path / "adapter", tmp_path / "merged"
    export_policy(run_dir, adapter_dir)
    export_policy(run_dir, merged_dir, merge_lora=True)
    assert (adapter_dir / "adapter_model.safetensors").is_file() and not (adapter_dir / "config.json").exists()

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
        peft_logits = PeftModel.from_pretrained(base, str(adapter_dir)).eval()(input_ids=ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, peft_logits, atol=1e-4, rtol=0)
    # the export carries the trained adapter, not the zero one peft starts from
    assert (peft_logits - base_logits).abs().max() > 1e-4
