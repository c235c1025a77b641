"""``relayrl export RUN_DIR OUT_DIR [--step N] [--merge-lora]``: a run's policy as a Hugging Face directory.

The trainer's checkpoints are ``torch.distributed.checkpoint`` shards; this loads the actor's
shards (without a process group) into the run's base model and writes what
``AutoModelForCausalLM.from_pretrained`` loads: config, safetensors, tokenizer and generation
config. The base model is the one the run trained (``runs/<id>/config.yaml``'s
``stack.model_dir``, else the built-in tiny model in ``runs/<id>/model``).

A LoRA run's checkpoint holds the actor with its adapter and the adapter's
``adapter_config.json``. With ``--merge-lora`` the adapter is merged into the base weights (a
plain Hugging Face directory, as above); without it ``OUT_DIR`` is the adapter in peft's format
(``adapter_config.json``, ``adapter_model.safetensors``) with the base model's tokenizer, and its
``base_model_name_or_path`` is the base model directory's absolute path, so
``AutoTokenizer.from_pretrained(OUT_DIR)`` and ``peft.AutoPeftModelForCausalLM.from_pretrained(OUT_DIR)``
(or ``PeftModel.from_pretrained(base, OUT_DIR)``) work from any working directory. With
``--with-base`` the base model is copied into ``OUT_DIR/base`` and recorded there instead, so the
export outlives the run directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from relayrl.models.adapters import CONFIG_FILE

# What ``relayrl up`` writes in every run directory: the checked config the run started with.
RUN_CONFIG = "config.yaml"


class ExportError(ValueError):
    """The run directory or the checkpoint asked for cannot be exported."""


def checkpoint_dir(run_dir: Path, step: int | None) -> Path:
    """The checkpoint of ``step``, or the latest one when ``step`` is None."""
    root = run_dir / "checkpoints"
    if step is None:
        marker = root / "latest"
        if not marker.is_file():
            raise ExportError(f"{run_dir} has no finished checkpoint ({marker} is missing)")
        path = root / marker.read_text().strip()
    else:
        path = root / f"step_{step:08d}"
    if not (path / "trainer_state.json").is_file():
        kept = sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*") if p.is_dir())
        raise ExportError(f"{run_dir} has no finished checkpoint at step {step}; kept steps: {kept}")
    return path


def base_model_dir(run_dir: Path) -> Path:
    config_file = run_dir / RUN_CONFIG
    if config_file.is_file():
        stack = (yaml.safe_load(config_file.read_text()) or {}).get("stack") or {}
        if stack.get("model_dir"):
            return Path(stack["model_dir"])
    model_dir = run_dir / "model"
    if not (model_dir / "config.json").is_file():
        raise ExportError(f"{run_dir}: cannot find the run's base model ({RUN_CONFIG} or model/)")
    return model_dir


# Where ``--with-base`` copies the base model inside an adapter export.
BASE_SUBDIR = "base"


def export_policy(
    run_dir: Path, out_dir: Path, step: int | None = None, merge_lora: bool = False, with_base: bool = False
) -> Path:
    """Writes the actor of checkpoint ``step`` (default: latest) to ``out_dir``; returns the checkpoint used."""
    import torch.distributed.checkpoint as dcp

    from relayrl.models.loading import load_causal_lm, load_tokenizer, save_hf_dir
    from services.trainer import lora

    checkpoint = checkpoint_dir(run_dir, step)
    # Absolute: a relative runs/<id>/model would only load from the directory the run started in.
    base = base_model_dir(run_dir).resolve()
    adapter_file = checkpoint / CONFIG_FILE
    if adapter_file.is_file():
        config = json.loads(adapter_file.read_text())
        config["base_model_name_or_path"] = str(base.resolve())
        model = lora.peft_model(base, config)
    else:
        model = load_causal_lm(base)
    state = {"actor": model.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["actor"])
    if adapter_file.is_file() and not merge_lora:
        # The base stays frozen under LoRA: peft would otherwise copy an adapted lm_head's (or
        # embedding's) whole base weight into the adapter, which the base directory already holds.
        model.save_pretrained(out_dir, safe_serialization=True, save_embedding_layers=False)
        load_tokenizer(base).save_pretrained(out_dir)
        recorded = base
        if with_base:
            recorded = (out_dir / BASE_SUBDIR).resolve()
            shutil.copytree(base, recorded, dirs_exist_ok=True)
        _record_base(out_dir / CONFIG_FILE, recorded)
        return checkpoint
    if adapter_file.is_file():
        model = lora.merge(model)
    save_hf_dir(model, base, out_dir)
    return checkpoint


def _record_base(adapter_config: Path, base: Path) -> None:
    """peft writes the path the base was loaded from; the export names it absolutely."""
    config = json.loads(adapter_config.read_text())
    config["base_model_name_or_path"] = str(base)
    adapter_config.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
