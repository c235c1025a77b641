"""``relayrl export`` of a LoRA run as a user meets it: a run directory named relative to where the
run started (its base model the built-in one in ``runs/<id>/model``), exported, then loaded from
another working directory with ``AutoTokenizer`` and peft."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoTokenizer

from commands.stack.export import export_policy
from relayrl.models.loading import load_causal_lm
from services.trainer import checkpoint as ckpt
from services.trainer import lora
from services.trainer.step import Models

IDS = [5, 6, 7, 8, 9]


def _lora_run(project: Path, tiny_model_dir: Path) -> tuple[Path, torch.Tensor]:
    """runs/lora in ``project`` (the working directory) with a LoRA checkpoint at step 2 whose adapter
    is not the zero one; returns the run directory (relative) and the adapted model's last logits."""
    run_dir = Path("runs/lora")
    shutil.copytree(tiny_model_dir, run_dir / "model")
    (run_dir / "config.yaml").write_text("stack: {run_id: lora}\n")  # the built-in model: no model_dir
    torch.manual_seed(0)
    actor = lora.add_adapter(load_causal_lm(run_dir / "model"), lora.LoraSpec(4, 8, ["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in actor.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    opt = torch.optim.AdamW([p for p in actor.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    ckpt.save(run_dir / "checkpoints", 2, Models(actor, opt, sched), {"step": 2, "version": 2}, keep=2)
    with torch.no_grad():
        logits = actor.eval()(input_ids=torch.tensor([IDS])).logits[0, -1]
    return run_dir, logits


def _last_logits(adapter: Path) -> torch.Tensor:
    """What a user's script elsewhere does with the export: tokenizer and model from its directory alone."""
    assert len(AutoTokenizer.from_pretrained(adapter)) > 0
    model = AutoPeftModelForCausalLM.from_pretrained(adapter).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([IDS])).logits[0, -1]


def test_an_adapter_export_loads_from_another_working_directory(tmp_path, tiny_model_dir, monkeypatch):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    run_dir, expected = _lora_run(project, tiny_model_dir)
    export_policy(run_dir, Path("adapter"))
    shipped = tmp_path / "shipped"
    export_policy(run_dir, shipped, with_base=True)
    recorded = json.loads((project / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(project / run_dir / "model"), "the base model by its absolute path"

    monkeypatch.chdir(elsewhere)
    torch.testing.assert_close(_last_logits(project / "adapter"), expected, atol=1e-4, rtol=0)
    # --with-base: the export outlives the run directory.
    shutil.rmtree(project / "runs")
    torch.testing.assert_close(_last_logits(shipped), expected, atol=1e-4, rtol=0)
