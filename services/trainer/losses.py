"""Policy, value and KL losses on padded response tensors, and their aggregation.

Every function returns per-token values (``_BT``) plus statistics; :func:`aggregate` turns
them into one number with a normaliser computed over the *global* batch (all ranks, all
micro-batches), so the sum of micro-batch losses over every rank is exactly the loss of the
whole batch and a 2-process run takes the same step as a 1-process one.

Log-prob names: ``logp`` the policy being trained, ``prox_logp`` the proximal policy (the
trainer's weights before this batch's first update, recomputed), ``behav_logp`` the policy
that sampled (from the engine).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.trainer.advantages import masked_mean

# exp() of a log-ratio beyond ±20 is meaningless and overflows in bf16; verl clamps the same way.
LOG_RATIO_CLAMP = 20.0


@dataclass(frozen=True, slots=True)
class PolicyLossConfig:
    variant: str = "vanilla"
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    is_cap: float = 2.0
    cispo_eps_low: float = 1.0
    cispo_eps_high: float = 0.28
    topr_positive_weight: float = 1.0
    topr_negative_weight: float = 1.0
    kimi15_tau: float = 0.1


@dataclass(slots=True)
class PolicyLossOut:
    loss_BT: torch.Tensor
    clipfrac: torch.Tensor
    clipfrac_lower: torch.Tensor
    ppo_kl: torch.Tensor


def _ratio(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.clamp(logp - ref, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def ppo_clip(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
) -> PolicyLossOut:
    """PPO clipped surrogate with dual clip: for A < 0 the loss is bounded by −A · clip_ratio_c."""
    ratio = _ratio(logp_BT, old_logp_BT)
    unclipped = -adv_BT * ratio
    clipped = -adv_BT * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clip1 = torch.maximum(unclipped, clipped)
    dual = -adv_BT * cfg.clip_ratio_c
    clip2 = torch.minimum(dual, clip1)
    loss = torch.where(adv_BT < 0, clip2, clip1)
    return PolicyLossOut(
        loss_BT=loss,
        clipfrac=masked_mean((clipped > unclipped).float(), mask_BT),
        clipfrac_lower=masked_mean(((clip1 > dual) & (adv_BT < 0)).float(), mask_BT),
        ppo_kl=masked_mean(old_logp_BT - logp_BT, mask_BT),
    )


def policy_loss(
    logp_BT: torch.Tensor,
    prox_logp_BT: torch.Tensor,
    behav_logp_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: PolicyLossConfig,
    score_BT: torch.Tensor | None = None,
    correction_BT: torch.Tensor | None = None,
) -> PolicyLossOut:
    """The per-token policy loss of ``cfg.variant``.

    - vanilla: PPO dual clip against the proximal policy (verl's default with recomputed old log-probs).
    - decoupled: the same, times w = min(π_prox / π_behav, is_cap) (AReaL's decoupled PPO): the clip
      keeps updates near the trainer's own policy, w corrects for who sampled.
    - tis: −min(π / π_behav, is_cap)·A·log π with the weight detached (truncated importance sampling).
    - cispo: −clip(π / π_behav, 1 − ε_low, 1 + ε_high)·A·log π, weight detached (MiniMax-M1's CISPO):
      every token keeps a gradient, only the weight is clipped.
    - topr: ROLL's tapered off-policy REINFORCE. Sequences whose score (``score_BT``, the sequence
      reward on every token) is > 0 get −w₊·A·log π (SFT-like, no weight); the others get
      −w₋·clip(π / π_behav, 0, 1)·A·log π with the weight detached.
    - kimi15: Kimi k1.5's −A·log π + τ/2·(log π − log π_behav)², as ROLL writes it.

    ``correction_BT`` (train–inference mismatch weights, detached) multiplies the vanilla loss; for
    decoupled it takes the place of the behaviour→proximal weight, which estimates the same ratio.
    """
    if cfg.variant in ("vanilla", "decoupled"):
        out = ppo_clip(logp_BT, prox_logp_BT, adv_BT, mask_BT, cfg)
        if correction_BT is not None:
            out.loss_BT = out.loss_BT * correction_BT.detach()
        elif cfg.variant == "decoupled":
            weight = torch.clamp(_ratio(prox_logp_BT, behav_logp_BT), max=cfg.is_cap).detach()
            out.loss_BT = out.loss_BT * weight
        return out
    if correction_BT is not None:
        raise ValueError(
            f"pg_variant {cfg.variant!r} already weights by π / π_behav; rollout_is applies to vanilla/decoupled"
        )
    ratio = _ratio(logp_BT, behav_logp_BT)
    if cfg.variant == "tis":
        weight = torch.clamp(ratio, max=cfg.is_cap)
        active = ratio > cfg.is_cap
        lower = torch.zeros_like(active)
    elif cfg.variant == "cispo":
        weight = torch.clamp(ratio, 1 - cfg.cispo_eps_low, 1 + cfg.cispo_eps_high)
        active = (ratio > 1 + cfg.cispo_eps_high) | (ratio < 1 - cfg.cispo_eps_low)
        lower = ratio < 1 - cfg.cispo_eps_low
    elif cfg.variant == "topr":
        if score_BT is None:
            raise ValueError("pg_variant 'topr' needs the sequence scores")
        positive = score_BT > 0
        tapered = torch.clamp(ratio, 0.0, 1.0).detach()
        loss = torch.where(
            positive,
            -cfg.topr_positive_weight * adv_BT * logp_BT,
            -cfg.topr_negative_weight * tapered * adv_BT * logp_BT,
        )
        return PolicyLossOut(
            loss_BT=loss,
            clipfrac=masked_mean((~positive & (ratio > 1.0)).float(), mask_BT),
            clipfrac_lower=torch.zeros(()),
            ppo_kl=masked_mean(behav_logp_BT - logp_BT, mask_BT),
        )
    elif cfg.variant == "kimi15":
        log_ratio = logp_BT - behav_logp_BT
        return PolicyLossOut(
            loss_BT=-adv_BT * logp_BT + 0.5 * cfg.kimi15_tau * log_ratio.square(),
            clipfrac=torch.zeros(()),
            clipfrac_lower=torch.zeros(()),
            ppo_kl=masked_mean(-log_ratio, mask_BT),
        )
    else:
        raise ValueError(f"unknown pg_variant {cfg.variant!r}")
    return PolicyLossOut(
        loss_BT=-weight.detach() * adv_BT * logp_BT,
        clipfrac=masked_mean(active.float(), mask_BT),
        clipfrac_lower=masked_mean(lower.float(), mask_BT),
        ppo_kl=masked_mean(behav_logp_BT - logp_BT, mask_BT),
    )


def kl_estimate(logp_BT: torch.Tensor, ref_logp_BT: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimators of Schulman's note: k1 = log r⁻¹, k2 = ½ (log r)², k3 = r − log r − 1."""
    log_ratio = logp_BT - ref_logp_BT
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        # r = π_ref/π; clamped as verl does so one wild token cannot explode the loss.
        neg = torch.clamp(-log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(neg) - neg - 1, min=-10.0, max=10.0)
    raise ValueError(f"unknown KL estimator {kind!r}; choose k1, k2 or k3")


@dataclass(slots=True)
class ValueLossOut:
    loss_BT: torch.Tensor
    clipfrac: torch.Tensor


def value_loss(
    values_BT: torch.Tensor, old_values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor, clip: float
) -> ValueLossOut:
    """½ max((V − R)², (clip(V, V_old ± c) − R)²) per token, as verl's critic."""
    clipped = old_values_BT + torch.clamp(values_BT - old_values_BT, -clip, clip)
    loss1 = (values_BT - returns_BT).square()
    loss2 = (clipped - returns_BT).square()
    return ValueLossOut(
        loss_BT=0.5 * torch.maximum(loss1, loss2), clipfrac=masked_mean((loss2 > loss1).float(), mask_BT)
    )


def explained_variance(values_BT: torch.Tensor, returns_BT: torch.Tensor, mask_BT: torch.Tensor) -> torch.Tensor:
    """1 − Var(R − V) / Var(R) over masked tokens; 0 when the returns have no variance."""
    var_r = masked_mean((returns_BT - masked_mean(returns_BT, mask_BT)).square(), mask_BT)
    resid = returns_BT - values_BT
    var_resid = masked_mean((resid - masked_mean(resid, mask_BT)).square(), mask_BT)
    if var_r <= 0:
        return torch.zeros(())
    return 1 - var_resid / var_r


@dataclass(frozen=True, slots=True)
class Normaliser:
    """Global counts over the whole batch that turn sums into means (see the module doc)."""

    tokens: float
    sequences: float


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, mode: str, norm: Normaliser) -> torch.Tensor:
    """This micro-batch's share of the batch loss under ``mode`` (verl's loss_agg_mode names).

    token-mean: Σ token losses / tokens in the batch; seq-mean-token-sum: Σ per-sequence sums /
    sequences; seq-mean-token-mean: Σ per-sequence means / sequences. Sequences with no response
    token count for nothing, so an empty mask gives exactly 0.
    """
    # where(), not a product: a non-finite value on a padded position must not leak in as NaN.
    masked = torch.where(mask_BT > 0, loss_BT, torch.zeros_like(loss_BT))
    if mode == "token-mean":
        return masked.sum() / max(norm.tokens, 1.0)
    if mode == "seq-mean-token-sum":
        return masked.sum() / max(norm.sequences, 1.0)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask_BT.sum(-1).clamp(min=1)
        return per_seq.sum() / max(norm.sequences, 1.0)
    raise ValueError(f"unknown loss_agg_mode {mode!r}")
