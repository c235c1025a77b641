"""Advantage estimators on padded response tensors.

Shapes: ``B`` sequences, ``T`` response positions (right-padded); ``mask_BT`` is 1 on real
response tokens. Rewards arrive per token (``token_rewards_BT``: the sequence reward sits on
the last real token unless the rollout gave token-level rewards). Formulas follow verl's
``core_algos`` so numbers compare one to one.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

EPS = 1e-6


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1; 0 (never NaN) when the mask is empty."""
    return torch.where(mask > 0, x, torch.zeros_like(x)).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x − mean) / std over masked entries (unbiased variance, as verl); 0 outside the mask."""
    count = mask.sum()
    if count < 2:
        return torch.zeros_like(x)
    mean = masked_mean(x, mask)
    var = ((x - mean) ** 2 * mask).sum() / (count - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8) * mask


def _group_stats(scores_B: torch.Tensor, group_ids: Sequence[int]) -> dict[int, torch.Tensor]:
    members: dict[int, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        members[gid].append(i)
    return {gid: scores_B[idx] for gid, idx in ((g, torch.tensor(m)) for g, m in members.items())}


def grpo(
    scores_B: torch.Tensor, mask_BT: torch.Tensor, group_ids: Sequence[int], norm_by_std: bool = True
) -> torch.Tensor:
    """Group-normalised outcome advantage: (r − mean_group) / (std_group + ε), per token.

    A group of one sample has no baseline: its advantage is 0 (verl: mean 0, std 1 gives r;
    we follow the GRPO paper, where a lone sample carries no relative signal).
    """
    stats = _group_stats(scores_B, group_ids)
    adv_B = torch.zeros_like(scores_B)
    for i, gid in enumerate(group_ids):
        group = stats[gid]
        if len(group) < 2:
            continue
        centred = scores_B[i] - group.mean()
        adv_B[i] = centred / (group.std() + EPS) if norm_by_std else centred
    return adv_B[:, None] * mask_BT


def rloo(scores_B: torch.Tensor, mask_BT: torch.Tensor, group_ids: Sequence[int]) -> torch.Tensor:
    """Leave-one-out baseline: r_i − mean of the other samples of the group; 0 for lone samples."""
    stats = _group_stats(scores_B, group_ids)
    adv_B = torch.zeros_like(scores_B)
    for i, gid in enumerate(group_ids):
        group = stats[gid]
        n = len(group)
        if n < 2:
            continue
        adv_B[i] = scores_B[i] - (group.sum() - scores_B[i]) / (n - 1)
    return adv_B[:, None] * mask_BT


def discounted_returns(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ G_{t+1} over the response, 0 on padding."""
    returns_BT = torch.zeros_like(token_rewards_BT)
    running_B = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(token_rewards_BT.shape[1])):
        running_B = token_rewards_BT[:, t] + gamma * running_B
        returns_BT[:, t] = running_B
        # Padding never feeds into earlier positions.
        running_B = running_B * mask_BT[:, t]
    return returns_BT * mask_BT


def reinforce_plus_plus(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++: discounted returns whitened over the whole batch."""
    return masked_whiten(discounted_returns(token_rewards_BT, mask_BT, gamma), mask_BT)


def gae(
    token_rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns (whitened advantages, returns = A + V).

    δ_t = r_t + γ V_{t+1} − V_t, A_t = δ_t + γλ A_{t+1}; the value after the last real token is 0.
    """
    values_BT = values_BT * mask_BT
    T = token_rewards_BT.shape[1]
    adv_BT = torch.zeros_like(token_rewards_BT)
    last_B = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(T)):
        next_v_B = values_BT[:, t + 1] if t + 1 < T else torch.zeros_like(last_B)
        delta_B = token_rewards_BT[:, t] + gamma * next_v_B - values_BT[:, t]
        last_B = (delta_B + gamma * lam * last_B) * mask_BT[:, t]
        adv_BT[:, t] = last_B
    returns_BT = (adv_BT + values_BT) * mask_BT
    return masked_whiten(adv_BT, mask_BT), returns_BT
