"""Train–inference mismatch correction (verl's rollout importance sampling).

The engine that sampled (``behav_logp``) and the trainer's recomputed proximal policy
(``prox_logp``, the same weights) disagree: bf16/fp8 kernels, MoE routing, stale batches. The
ratio ρ = π_prox / π_behav measures that gap. Here it becomes a detached weight on the policy loss,
at verl's three levels and two modes:

- level ``token``: ρ_t per token; ``sequence``: Π_t ρ_t per sequence; ``geometric``: (Π_t ρ_t)^(1/T).
- mode ``truncate``: w = min(ρ, upper); ``mask``: w = ρ inside [lower, upper], 0 outside. Token level
  with ``mask`` is IcePop's token masking.
- veto: a sequence with any token ρ_t < ``veto_threshold`` gets weight 0 (a catastrophic outlier).

Masked and vetoed tokens also leave the loss's normaliser (``keep_BT``), as verl's rejection mask
does: a rejected token is not a token of the batch, so it must not dilute the mean of the others.

Sequence-level ratios are formed in log space and clamped so one long sequence cannot overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.trainer.advantages import masked_mean

LOG_RATIO_CLAMP = 20.0
QUANTILES = (0.05, 0.5, 0.95)


@dataclass(frozen=True, slots=True)
class CorrectionConfig:
    level: str = "token"
    mode: str = "truncate"
    threshold: float = 2.0
    threshold_lower: float | None = None
    veto_threshold: float | None = None

    @property
    def lower(self) -> float:
        return self.threshold_lower if self.threshold_lower is not None else 1.0 / self.threshold


@dataclass(slots=True)
class CorrectionOut:
    weight_BT: torch.Tensor
    """Detached weight per token (0 where masked or vetoed); padded positions are 0."""
    keep_BT: torch.Tensor
    """1.0 where a response token stays in the loss (neither masked nor vetoed), else 0.0."""
    metrics: dict[str, float]


def _masked_quantiles(x_BT: torch.Tensor, mask_BT: torch.Tensor) -> list[float]:
    values = x_BT[mask_BT > 0].double()
    if values.numel() == 0:
        return [0.0 for _ in QUANTILES]
    return torch.quantile(values, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()


def correction_weights(
    prox_logp_BT: torch.Tensor, behav_logp_BT: torch.Tensor, mask_BT: torch.Tensor, cfg: CorrectionConfig
) -> CorrectionOut:
    """Importance weights of ``cfg`` and the mismatch metrics (KL, share masked, ratio quantiles)."""
    mask = mask_BT > 0
    log_ratio = torch.where(mask, prox_logp_BT - behav_logp_BT, torch.zeros_like(prox_logp_BT)).detach()
    token_ratio = torch.exp(torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if cfg.level == "token":
        ratio = token_ratio
    elif cfg.level in ("sequence", "geometric"):
        seq = log_ratio.sum(-1)
        if cfg.level == "geometric":
            seq = seq / mask.sum(-1).clamp(min=1)
        ratio = torch.exp(torch.clamp(seq, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"unknown rollout_is_level {cfg.level!r}")
    if cfg.mode == "truncate":
        weight = torch.clamp(ratio, max=cfg.threshold)
        masked = torch.zeros_like(mask)
    elif cfg.mode == "mask":
        masked = (ratio < cfg.lower) | (ratio > cfg.threshold)
        weight = torch.where(masked, torch.zeros_like(ratio), ratio)
    else:
        raise ValueError(f"unknown rollout_is_mode {cfg.mode!r}")
    if cfg.veto_threshold is not None:
        vetoed = ((token_ratio < cfg.veto_threshold) & mask).any(-1, keepdim=True).expand_as(mask)
        masked = masked | vetoed
        weight = torch.where(vetoed, torch.zeros_like(weight), weight)
    weight = torch.where(mask, weight, torch.zeros_like(weight))
    fmask = mask.to(prox_logp_BT.dtype)
    q05, q50, q95 = _masked_quantiles(ratio, fmask)
    metrics = {
        # KL(π_behav ‖ π_prox) by the k1 estimator over tokens the engine sampled.
        "mismatch/kl": float(masked_mean(-log_ratio, fmask)),
        "mismatch/k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, fmask)),
        "mismatch/masked_frac": float(masked_mean((masked & mask).to(fmask.dtype), fmask)),
        "mismatch/ratio_mean": float(masked_mean(ratio, fmask)),
        "mismatch/ratio_q05": q05,
        "mismatch/ratio_q50": q50,
        "mismatch/ratio_q95": q95,
        "mismatch/weight_mean": float(masked_mean(weight, fmask)),
    }
    keep = (mask & ~masked).to(fmask.dtype)
    return CorrectionOut(weight_BT=weight, keep_BT=keep, metrics=metrics)
