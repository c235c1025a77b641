"""The actor, critic and reference models: loading, FSDP2 wrapping, and the forward passes
that turn a micro-batch into per-response-token log-probs, entropies or values."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from services.trainer.batching import MicroBatch, gather_response
from services.trainer.config import LrSchedulerType


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model (``model.model.layers`` in Qwen2/Llama),
    also inside a peft wrapper (LoRA)."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    base = getattr(model, model.base_model_prefix, model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .layers to shard; only decoder-only LMs are supported")
    return list(layers)


def shard_model(model: nn.Module, bf16: bool) -> nn.Module:
    """FSDP2: each decoder block is its own unit (all-gathered just in time), then the root.

    With ``bf16`` parameters are gathered and computed in bf16 while master weights, gradients'
    reduction and the optimizer stay in fp32 (log-probs are taken from fp32 logits); else
    everything is fp32.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def load_actor(model_dir: Path, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, local_files_only=True)
    return model.to(device)


def load_critic(model_dir: Path, device: torch.device, seed: int) -> nn.Module:
    """The actor's architecture with a one-output value head on every position (verl's critic)."""
    from transformers import AutoModelForTokenClassification

    torch.manual_seed(seed)  # the fresh value head is initialised identically on every rank
    model = AutoModelForTokenClassification.from_pretrained(
        str(model_dir), num_labels=1, dtype=torch.float32, local_files_only=True
    )
    return model.to(device)


@dataclass(slots=True)
class PolicyOut:
    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None


def policy_forward(model: nn.Module, mb: MicroBatch, temperature: float, with_entropy: bool) -> PolicyOut:
    """Log-probs of the response tokens under ``model`` at the sampling temperature.

    Logits are divided by the temperature before log_softmax (as verl does), so at
    temperature 1 these are the engine's log-probs up to numerics. Results stay on the model's device.
    """
    device = next(model.parameters()).device
    ids_BL = mb.input_ids_BL.to(device)
    out = model(input_ids=ids_BL, attention_mask=mb.attention_mask_BL.to(device), use_cache=False)
    T = mb.mask_BT.shape[1]
    logits_BTV = gather_response(out.logits, mb.response_start_B, T).float() / temperature
    targets_BL = mb.input_ids_BL
    pos_BT = (mb.response_start_B[:, None] + torch.arange(T)[None, :]).clamp(max=targets_BL.shape[1] - 1)
    targets_BT = targets_BL.gather(1, pos_BT).to(device)
    logp_all_BTV = torch.log_softmax(logits_BTV, dim=-1)
    logp_BT = logp_all_BTV.gather(-1, targets_BT[..., None]).squeeze(-1)
    entropy_BT = None
    if with_entropy:
        entropy_BT = -(logp_all_BTV.exp() * logp_all_BTV).sum(-1)
    return PolicyOut(logp_BT, entropy_BT)


def value_forward(critic: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """V(state before each response token), shape [B, T], on the model's device."""
    device = next(critic.parameters()).device
    out = critic(input_ids=mb.input_ids_BL.to(device), attention_mask=mb.attention_mask_BL.to(device))
    return gather_response(out.logits[..., 0].float(), mb.response_start_B, mb.mask_BT.shape[1])


def clip_and_step(model: nn.Module, opt: torch.optim.Optimizer, max_norm: float) -> tuple[float, bool]:
    """Clips the gradients to ``max_norm`` and steps only when their norm is finite (a NaN never
    reaches the weights); returns (the norm before clipping, whether it stepped)."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm_f = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    stepped = math.isfinite(norm_f)
    if stepped:
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norm_f, stepped


@dataclass(frozen=True, slots=True)
class LrSchedule:
    """verl's actor schedules: a linear warm-up, then ``constant`` or a ``cosine`` decay that reaches
    ``min_lr_ratio`` × lr at ``total_steps``."""

    warmup_steps: int = 0
    kind: LrSchedulerType = "constant"
    total_steps: int = 0
    min_lr_ratio: float = 0.0

    def factor(self, step: int) -> float:
        """The multiple of lr used by update ``step + 1`` (LambdaLR counts the updates already made)."""
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant" or self.total_steps <= self.warmup_steps:
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / (self.total_steps - self.warmup_steps))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, schedule: LrSchedule):
    """AdamW over the trainable parameters (with LoRA, the adapter's) with ``schedule`` on its learning rate."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, foreach=False)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule.factor)
