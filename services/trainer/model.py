"""The actor, critic and reference models: loading, FSDP2 wrapping, and the forward passes
that turn a micro-batch into per-response-token log-probs, entropies or values."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from relayrl.devices import upload
from services.trainer.batching import MicroBatch, gather_response
from services.trainer.config import LrSchedulerType, TrainerSettings


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


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """How the trainer builds a model (the settings' part of it): verl's ``attn_implementation``,
    ``enable_gradient_checkpointing`` and ``use_torch_compile``."""

    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    compile: bool = False

    @classmethod
    def of(cls, s: TrainerSettings) -> ModelOptions:
        return cls(s.resolved_attn_implementation, s.enable_gradient_checkpointing, s.use_torch_compile)

    @property
    def compiles(self) -> bool:
        """Whether the model builds kernels at its first passes: its blocks compiled, or
        flex_attention, which transformers compiles with its block mask."""
        return self.compile or self.attn_implementation == "flex_attention"


def prepare_model(model: nn.Module, options: ModelOptions) -> nn.Module:
    """Gradient checkpointing and compilation of each decoder block, before FSDP wraps them.

    Checkpointing keeps only each block's input for the backward and runs the block's forward again
    there (torch's non-reentrant checkpoint, which FSDP2 supports). Compilation is per block, as
    torchtitan does: one graph serves every block of a shape, and FSDP's hooks stay outside it.
    """
    if options.gradient_checkpointing:
        hf = model.get_base_model() if hasattr(model, "get_base_model") else model
        kwargs = {"use_reentrant": False}
        if hasattr(hf, "activation_checkpointing_enable"):  # its name from transformers 5.23 on
            hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if options.compiles:
        # Packed micro-batches differ in length at every step: compiled graphs (transformers compiles
        # flex_attention and its block mask) take the length as a symbol from their first compile,
        # instead of a first graph for one length and a second, general one at the next step.
        torch._dynamo.config.assume_static_by_default = False
    if options.compile:
        for layer in _decoder_layers(model):
            layer.compile()
    return model


def shard_model(model: nn.Module, bf16: bool) -> nn.Module:
    """FSDP2: each decoder block is its own unit (all-gathered just in time), then the root.

    With ``bf16`` parameters are gathered and computed in bf16 (FSDP2's ``MixedPrecisionPolicy``,
    verl's ``mixed_precision.param_dtype``) while master weights, gradients' reduction and the
    optimizer stay in fp32 (log-probs are taken from fp32 logits); else everything is fp32. The root
    (embeddings, final norm, output head) stays gathered from its forward to the end of the backward:
    the log-probs read the output head after the forward (:func:`policy_forward`), and the backward
    needs it at once anyway (FSDP2 does so for every root).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # The mesh of the device the model was loaded on: FSDP2's default is torch's accelerator, so on a
    # GPU host a CPU trainer's parameters would silently move to the GPU (and through gloo).
    device = next(model.parameters()).device
    kwargs: dict[str, Any] = {"mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # Every block reshards after its forward, the last one too: peft's adapter switch (the LoRA
    # reference) sets requires_grad on the parameters registered at the time, which must be the
    # sharded ones that the optimizer and the publish see.
    for layer in _decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)
    return model


def load_actor(model_dir: Path, device: torch.device, attn_implementation: str = "sdpa") -> nn.Module:
    from transformers import AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True, attn_implementation=attn_implementation
    )
    return model.to(device)


def load_critic(model_dir: Path, device: torch.device, seed: int, attn_implementation: str = "sdpa") -> nn.Module:
    """The actor's architecture with a one-output value head on every position (verl's critic)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    torch.manual_seed(seed)  # the fresh value head is initialised identically on every rank
    config = AutoConfig.from_pretrained(str(model_dir), num_labels=1, local_files_only=True)
    # No dropout before the value head (transformers' default is 0.1), as verl sets it: the old values
    # and the update's values must be one function, and ranks and micro-batch layouts must agree.
    config.classifier_dropout = 0.0
    model = AutoModelForTokenClassification.from_pretrained(
        str(model_dir),
        config=config,
        dtype=torch.float32,
        local_files_only=True,
        attn_implementation=attn_implementation,
    )
    return model.to(device)


@dataclass(slots=True)
class PolicyOut:
    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None


# Tokens whose logits exist at once: 1024 × Qwen's 151,936-token vocabulary is 0.6 GB in fp32
# (with its softmax), where a 16k-token micro-batch's whole logits would be 10 GB.
LOGPROB_CHUNK_TOKENS = 1024


def _causal_lm(model: nn.Module) -> nn.Module:
    """The transformers causal LM inside ``model`` (itself, a peft wrapper's base, or the actor
    behind a LoRA reference)."""
    from services.trainer.lora import AdapterDisabled

    if isinstance(model, AdapterDisabled):
        model = model.actor
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def output_head(model: nn.Module) -> nn.Module:
    """The module that turns final hidden states into logits (``lm_head``)."""
    return _causal_lm(model).get_output_embeddings()


def last_hidden(model: nn.Module, mb: Any) -> torch.Tensor:
    """The final norm's output (what the output head reads) for every position of ``mb`` (anything
    with ``model_inputs(device)``), [R, L, H].

    The model runs its whole forward (FSDP's hooks, peft's adapter switch) but computes logits for
    one position only (``logits_to_keep``): the log-probs take the head chunk by chunk instead.
    """
    lm = _causal_lm(model)
    norm = getattr(lm, lm.base_model_prefix).norm
    captured: list[torch.Tensor] = []
    handle = norm.register_forward_hook(lambda _module, _args, out: captured.append(out))
    try:
        model(**mb.model_inputs(next(model.parameters()).device), use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return captured[-1]


def _logit_stats(
    logits_NV: torch.Tensor, targets_N: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_NV = logits_NV.float() / temperature
    logz_N = torch.logsumexp(logits_NV, dim=-1)
    logp_N = logits_NV.gather(-1, targets_N[:, None]).squeeze(-1) - logz_N
    if not with_entropy:
        return logp_N, torch.zeros_like(logp_N)
    # H = log Z − Σ p·logit: one softmax, no second [N, V] tensor of log-probs.
    entropy_N = logz_N - (torch.softmax(logits_NV, dim=-1) * logits_NV).sum(-1)
    return logp_N, entropy_N


def fuses_logit_stats(device_type: str) -> bool:
    """Whether :func:`token_logprobs` compiles its statistics on this device by default: on CUDA; on a
    CPU the compile would cost each trainer process more than it saves."""
    return device_type == "cuda"


@functools.cache
def _fused_logit_stats() -> Any:
    """:func:`_logit_stats` compiled: its upcast, temperature, log-sum-exp, softmax and sums (and their
    backward) become a few kernels that each read a chunk's logits once, where eager torch makes
    about a dozen float32 passes over them (a 1024-token chunk of Qwen's vocabulary is 0.6 GB a pass,
    with the recompute and the backward near 30 GB of memory traffic a chunk)."""
    return torch.compile(_logit_stats, fullgraph=True)


def _chunk_logprobs(
    head: nn.Module,
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits_NV = head(hidden_NH)
    # torch.compile specialises a size of 1: a one-token chunk (rare) is taken eagerly, not compiled again.
    if not fused or logits_NV.shape[0] < 2:
        return _logit_stats(logits_NV, targets_N, temperature, with_entropy)
    # The chunk's length as a symbol from the first compile: the last chunk of every pass is shorter.
    torch._dynamo.mark_dynamic(logits_NV, 0)
    torch._dynamo.mark_dynamic(targets_N, 0)
    return _fused_logit_stats()(logits_NV, targets_N, temperature, with_entropy)


def token_logprobs(
    head: nn.Module,
    hidden_NH: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int = LOGPROB_CHUNK_TOKENS,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and the entropy of each token's distribution, from hidden states and the output
    head, ``chunk_tokens`` at a time: the [N, V] logits never exist whole.

    With gradients each chunk is checkpointed: the backward computes its logits again, one chunk at a
    time, so peak memory follows the chunk, not tokens × vocabulary. ``fused`` (default:
    :func:`fuses_logit_stats`) takes the statistics from the logits with compiled kernels
    (:func:`_fused_logit_stats`).
    """
    if fused is None:
        fused = fuses_logit_stats(hidden_NH.device.type)
    logps, entropies = [], []
    for start in range(0, hidden_NH.shape[0], chunk_tokens):
        args = (head, hidden_NH[start : start + chunk_tokens], targets_N[start : start + chunk_tokens])
        if torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            logp, entropy = checkpoint(_chunk_logprobs, *args, temperature, with_entropy, fused, use_reentrant=False)
        else:
            logp, entropy = _chunk_logprobs(*args, temperature, with_entropy, fused)
        logps.append(logp)
        entropies.append(entropy)
    return torch.cat(logps), torch.cat(entropies) if with_entropy else None


def logprobs_at(
    model: nn.Module,
    hidden_RLH: torch.Tensor,
    row_N: torch.Tensor,
    pos_N: torch.Tensor,
    targets_N: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) (and the entropy) of each token predicted by the hidden state at (row, position),
    all three given as host tensors: only those positions meet the output head, in chunks
    (:func:`token_logprobs`), not the padding around them. Results are on the hidden states' device."""
    device = hidden_RLH.device
    hidden_NH = hidden_RLH[upload(row_N, device), upload(pos_N, device)]
    return token_logprobs(output_head(model), hidden_NH, upload(targets_N, device), temperature, with_entropy)


def scattered(values_N: torch.Tensor, flat_N: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A zero tensor of ``shape`` with ``values_N`` at the flat indices ``flat_N`` (on the values' device)."""
    zeros = torch.zeros(math.prod(shape), dtype=values_N.dtype, device=values_N.device)
    return zeros.scatter(0, flat_N, values_N).view(shape)


def policy_forward(model: nn.Module, mb: MicroBatch, temperature: float, with_entropy: bool) -> PolicyOut:
    """Log-probs of the response tokens under ``model`` at the sampling temperature.

    Logits are divided by the temperature before log_softmax (as verl does), so at
    temperature 1 these are the engine's log-probs up to numerics. Only the response tokens meet the
    output head (:func:`logprobs_at`), not the padding of the [B, T] rectangle: the head and its
    log-softmax over the vocabulary are a large part of a step's work. Results stay on the model's
    device, zero in the padding.
    """
    hidden_RLH = last_hidden(model, mb)
    B, T = mb.mask_BT.shape
    b_N, t_N = mb.response_positions()
    row_N = mb.rows()[b_N]
    # Clamped into the row only for the stand-in position of a micro-batch without response tokens.
    pos_N = (mb.response_start_B[b_N] + t_N).clamp(1, mb.input_ids_BL.shape[1] - 1)
    targets_N = mb.input_ids_BL[row_N, pos_N]
    logp_N, entropy_N = logprobs_at(model, hidden_RLH, row_N, pos_N - 1, targets_N, temperature, with_entropy)
    # Uploaded once: the log-probs and the entropy fill the same positions.
    flat_N = upload(b_N * T + t_N, logp_N.device)
    entropy_BT = scattered(entropy_N, flat_N, (B, T)) if entropy_N is not None else None
    return PolicyOut(scattered(logp_N, flat_N, (B, T)), entropy_BT)


def value_forward(critic: nn.Module, mb: MicroBatch) -> torch.Tensor:
    """V(state before each response token), shape [B, T], on the model's device."""
    # No cache: with one, transformers would not read the packed sequences from position_ids.
    out = critic(**mb.model_inputs(next(critic.parameters()).device), use_cache=False)
    return gather_response(out.logits[..., 0].float(), mb.response_start_B, mb.mask_BT.shape[1], mb.row_B)


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


@dataclass(frozen=True, slots=True)
class AdamW:
    """One model's AdamW hyperparameters (the trainer's lr or critic_lr, weight_decay, adam_eps,
    adam_betas)."""

    lr: float
    weight_decay: float = 0.0
    eps: float = 1e-8
    betas: tuple[float, float] = (0.9, 0.999)

    def changes_from(self, group: dict[str, Any]) -> list[str]:
        """``name old -> new`` for each value that differs from those of an optimizer's param group."""
        saved = {
            "lr": group["initial_lr"],
            "weight_decay": group["weight_decay"],
            "adam_eps": group["eps"],
            "adam_betas": tuple(group["betas"]),
        }
        wanted = {"lr": self.lr, "weight_decay": self.weight_decay, "adam_eps": self.eps, "adam_betas": self.betas}
        changed = [name for name, value in wanted.items() if saved[name] != value]
        return [f"{name} {_shown(saved[name])} -> {_shown(wanted[name])}" for name in changed]


def _shown(value: float | tuple[float, ...]) -> str:
    return f"({', '.join(f'{v:g}' for v in value)})" if isinstance(value, tuple) else f"{value:g}"


def build_optimizer(model: nn.Module, adamw: AdamW, schedule: LrSchedule):
    """AdamW over the trainable parameters (with LoRA, the adapter's) with ``schedule`` on its learning rate."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    # torch's own choice of implementation: on CUDA one multi-tensor kernel per operation over every
    # parameter (foreach), instead of a dozen launches per parameter; on a CPU, one at a time.
    opt = torch.optim.AdamW(trainable, lr=adamw.lr, weight_decay=adamw.weight_decay, eps=adamw.eps, betas=adamw.betas)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule.factor)


def retake_hyperparameters(
    opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR, adamw: AdamW
) -> list[str]:
    """After a checkpoint's optimizer and scheduler state are loaded, this run's hyperparameters take
    over again: a state dict brings back the ones it was saved with, so a run resumed with a lower
    lr would otherwise go on with the old one. Adam's moments and the schedule's place are kept.
    Returns ``name old -> new`` for each that changed."""
    changes = adamw.changes_from(opt.param_groups[0])
    sched.base_lrs = [adamw.lr] * len(opt.param_groups)
    for group, factor in zip(opt.param_groups, sched.lr_lambdas, strict=True):
        group.update(
            initial_lr=adamw.lr,
            lr=adamw.lr * factor(sched.last_epoch),
            weight_decay=adamw.weight_decay,
            eps=adamw.eps,
            betas=adamw.betas,
        )
    return changes
