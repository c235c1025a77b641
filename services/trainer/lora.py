"""LoRA for the actor with ``peft``: the adapter that trains, the tensors a version publishes, and
the reference policy that is the same weights with the adapter off.

Names follow peft's on-disk format (``adapter_model.safetensors``): a parameter
``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`` of the live model is
published and saved as ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`` (the
adapter's name dropped), which is what ``peft.PeftModel.from_pretrained`` and SGLang's
``/load_lora_adapter`` read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ADAPTER = "default"  # peft's name of the one adapter a model gets from get_peft_model


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """verl's ``lora_rank``, ``lora_alpha`` and ``target_modules``."""

    rank: int
    alpha: float
    target_modules: list[str] | str

    def peft_config(self) -> Any:
        from peft import LoraConfig

        # No dropout: the log-probs of the update's forward must be those of the policy that
        # sampled (PPO's ratio), as verl and SGLang assume.
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            target_modules=self.target_modules,
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )


def add_adapter(model: nn.Module, spec: LoraSpec) -> nn.Module:
    """``model`` wrapped by peft with a fresh adapter; only the adapter's parameters train.

    peft initialises B to zero, so version 0 (the base model the engines serve) is still exactly
    the policy, and A from the torch seed, identically on every rank.
    """
    from peft import get_peft_model

    return get_peft_model(model, spec.peft_config(), adapter_name=ADAPTER)


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def peft_name(name: str) -> str:
    """A live parameter's name as peft saves it (the adapter's name dropped)."""
    return name.replace(f".{ADAPTER}.", ".")


def adapter_items(actor: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapter's parameters (the ones that train) under the names peft saves them with."""
    return [(peft_name(name), p) for name, p in actor.named_parameters() if p.requires_grad]


def adapter_config(actor: nn.Module) -> dict[str, Any]:
    """The actor's ``adapter_config.json``, pointing at the base model directory it trains."""
    config = actor.peft_config[ADAPTER].to_dict()
    if config.get("base_model_name_or_path"):
        config["base_model_name_or_path"] = str(Path(config["base_model_name_or_path"]).resolve())
    # peft stores a set here, which JSON cannot carry.
    if isinstance(config.get("target_modules"), set):
        config["target_modules"] = sorted(config["target_modules"])
    return json.loads(json.dumps(config, default=str))


class AdapterDisabled(nn.Module):
    """The reference policy of a LoRA actor: the actor's own weights with the adapter off
    (peft's ``disable_adapter``), so the base model is never held twice."""

    def __init__(self, actor: nn.Module) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.actor.disable_adapter():
            return self.actor(*args, **kwargs)


def peft_model(base_dir: Path, config: Mapping[str, Any]) -> nn.Module:
    """The base model of ``base_dir`` with an adapter shaped by ``config`` (an ``adapter_config.json``)."""
    from peft import LoraConfig, get_peft_model

    from relayrl.models.loading import load_causal_lm

    known = set(LoraConfig.__dataclass_fields__)
    lora_config = LoraConfig(**{k: v for k, v in config.items() if k in known})
    return get_peft_model(load_causal_lm(base_dir), lora_config, adapter_name=ADAPTER)


def merge(model: nn.Module) -> nn.Module:
    """The peft ``model`` with its adapter merged into the base weights: a plain transformers model.

    An adapted ``lm_head`` whose weight is the input embedding (tied, as in Qwen2.5 and the tiny
    presets) gets a weight of its own first: merged into the shared tensor, the head's update
    would change the embedding too, and the merged model would no longer be the adapted one.
    """
    base = model.get_base_model()
    head = base.get_output_embeddings()
    layer = getattr(head, "base_layer", None)
    if layer is not None and layer.weight is base.get_input_embeddings().weight:
        layer.weight = nn.Parameter(layer.weight.detach().clone(), requires_grad=False)
        base.config.tie_word_embeddings = False
    return model.merge_and_unload()


def merged_model(base_dir: Path, adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> nn.Module:
    """The base model of ``base_dir`` with ``adapter`` (peft's names) merged into its weights: a
    plain transformers model, as if it had been trained in full."""
    from peft import set_peft_model_state_dict

    model = peft_model(base_dir, config)
    result = set_peft_model_state_dict(model, dict(adapter), adapter_name=ADAPTER)
    if result.unexpected_keys:
        raise ValueError(f"adapter tensors the model has no place for: {result.unexpected_keys[:5]}")
    return merge(model)
