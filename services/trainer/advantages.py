"""Advantage estimators on padded response tensors.

Shapes: ``B`` sequences, ``T`` response positions (right-padded); ``mask_BT`` is 1 on the
model's response tokens, 0 on padding and on the observation tokens of a multi-turn episode
(verl's ``response_mask`` as its agent loop sets it). Rewards arrive per token
(``token_rewards_BT``: per-turn rewards on the last token of their turn, the sequence reward
on the last model token). Nothing outside the mask is read: scores sum model positions only,
and the recurrences below skip the rest. Formulas follow verl's ``core_algos`` so numbers
compare one to one.
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
    inside = mask > 0
    mean = masked_mean(x, mask)
    var = torch.where(inside, (x - mean) ** 2, torch.zeros_like(x)).sum() / (count - 1)
    return torch.where(inside, (x - mean) * torch.rsqrt(var + 1e-8), torch.zeros_like(x))


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
    """G_t = r_t + γ G_{t+1} over the response, 0 outside the mask.

    As verl's REINFORCE++, the running return restarts at every position outside the mask:
    padding, and also each observation of a multi-turn episode, so a model turn's return
    holds the rewards of its own turn only (a turn is credited through its per-turn reward;
    the sequence reward reaches the last turn).
    """
    returns_BT = torch.zeros_like(token_rewards_BT)
    running_B = torch.zeros_like(token_rewards_BT[:, 0])
    for t in reversed(range(token_rewards_BT.shape[1])):
        inside = mask_BT[:, t] > 0
        running_B = torch.where(inside, token_rewards_BT[:, t] + gamma * running_B, torch.zeros_like(running_B))
        returns_BT[:, t] = running_B
    return returns_BT


def reinforce_plus_plus(token_rewards_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++: discounted returns whitened over the whole batch."""
    return masked_whiten(discounted_returns(token_rewards_BT, mask_BT, gamma), mask_BT)


def gae(
    token_rewards_BT: torch.Tensor, values_BT: torch.Tensor, mask_BT: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation; returns (whitened advantages, returns = A + V).

    δ_t = r_t + γ V_next − V_t, A_t = δ_t + γλ A_next, where "next" is the next position inside
    the mask: as verl's ``compute_gae_advantage_return``, positions outside it (observation
    tokens, padding) are skipped, V_next and A_next carrying across them unchanged, and their
    own rewards and values are never read. So a turn's last token bootstraps from the value of
    the next turn's first token, and the value after the last model token is 0. Advantages and
    returns are 0 outside the mask (verl leaves the carried values there, which no loss reads).
    """
    next_v_B = torch.zeros_like(token_rewards_BT[:, 0])
    last_B = torch.zeros_like(next_v_B)
    adv_BT = torch.zeros_like(token_rewards_BT)
    for t in reversed(range(token_rewards_BT.shape[1])):
        inside = mask_BT[:, t] > 0
        delta_B = token_rewards_BT[:, t] + gamma * next_v_B - values_BT[:, t]
        # where(), not a blend with the mask: a non-finite value on a skipped position stays out.
        last_B = torch.where(inside, delta_B + gamma * lam * last_B, last_B)
        next_v_B = torch.where(inside, values_BT[:, t], next_v_B)
        adv_BT[:, t] = torch.where(inside, last_B, torch.zeros_like(last_B))
    returns_BT = torch.where(mask_BT > 0, adv_BT + values_BT, torch.zeros_like(adv_BT))
    return masked_whiten(adv_BT, mask_BT), returns_BT
