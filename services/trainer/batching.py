"""From trajectory groups to per-rank micro-batches of padded tensors.

Every rank receives the whole batch (rank 0 pulled it and broadcast it); each rank then takes
its shard, and packs the shard into micro-batches under a token budget. Sequences are padded
to the longest one in their micro-batch (right padding), so the budget counts padded tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relayrl.schema import Group
from relayrl.staleness import oldest_model_version


@dataclass(slots=True)
class TrainSample:
    """One response as the trainer needs it; ``group`` indexes the batch's groups.

    ``loss_mask`` is 1 on the model's tokens and 0 on observation tokens of a multi-turn
    episode; empty means every response token is the model's (a single-turn sample).
    """

    group: int
    prompt_ids: list[int]
    response_ids: list[int]
    behav_logp: list[float]
    token_rewards: list[float]
    reward: float
    min_version: int
    truncated: bool = False  # the engine stopped it at the length budget (finish_reason "length")
    loss_mask: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def model_mask(self) -> list[int]:
        """1 on each response token the model generated, 0 on observation tokens."""
        return list(self.loss_mask) if self.loss_mask else [1] * len(self.response_ids)

    @property
    def model_tokens(self) -> int:
        return sum(self.model_mask)


def samples_from_groups(groups: list[Group]) -> list[TrainSample]:
    """Flattens groups into samples. Token rewards are the per-turn rewards that came (each on
    its turn's last model token), plus the sequence reward on the last model token."""
    samples = []
    for gi, group in enumerate(groups):
        for s in group.samples:
            n = len(s.response_token_ids)
            token_rewards = list(s.token_rewards) if s.token_rewards else [0.0] * n
            model = [i for i, m in enumerate(s.loss_mask) if m] if s.loss_mask else list(range(n))
            if model:
                token_rewards[model[-1]] += s.reward
            oldest = oldest_model_version(s.policy_versions, s.loss_mask)
            samples.append(
                TrainSample(
                    group=gi,
                    prompt_ids=list(s.prompt_token_ids),
                    response_ids=list(s.response_token_ids),
                    behav_logp=list(s.behavior_logprobs),
                    token_rewards=token_rewards,
                    reward=s.total_reward,
                    min_version=-1 if oldest is None else oldest,
                    truncated=s.finish_reason == "length",
                    loss_mask=list(s.loss_mask),
                )
            )
    return samples


def shard(num_samples: int, lengths: list[int], rank: int, world_size: int) -> list[int]:
    """Indices of this rank's samples: longest first, dealt round-robin, so token counts balance."""
    order = sorted(range(num_samples), key=lambda i: (-lengths[i], i))
    return sorted(order[rank::world_size])


# Largest padding share of one micro-batch: a run of sorted sequences is cut early rather than
# let a short one pad to a long one. More, smaller micro-batches cost little (compute follows
# tokens); padding is compute spent on nothing.
MAX_PADDING_SHARE = 0.1


def pack(lengths: list[int], budget: int, max_padding: float = MAX_PADDING_SHARE) -> list[list[int]]:
    """Groups indices into micro-batches whose padded size (count × longest) fits ``budget``
    (verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``).

    Sequences are sorted by length and cut into consecutive runs, so each micro-batch holds
    sequences of similar length; a run is also cut where padding would exceed ``max_padding``
    of its tokens, which keeps padding low on a long-tailed mix. A sequence longer than the
    budget gets a micro-batch of its own.
    """
    bins: list[list[int]] = []
    longest = real = 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        # Descending order: the first member of a run is its longest.
        padded = (len(bins[-1]) + 1) * longest if bins else 0
        if bins and padded <= budget and padded - real - lengths[i] <= max_padding * padded:
            bins[-1].append(i)
            real += lengths[i]
        else:
            bins.append([i])
            longest = real = lengths[i]
    return [sorted(b) for b in bins]


def pack_by_count(lengths: list[int], per_batch: int) -> list[list[int]]:
    """``per_batch`` sequences per micro-batch, in length order (verl's ``ppo_micro_batch_size_per_gpu``)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [sorted(order[k : k + per_batch]) for k in range(0, len(order), per_batch)]


def padding_tokens(lengths: list[int], bins: list[list[int]]) -> tuple[int, int]:
    """(padding tokens, all tokens incl. padding) of micro-batches padded to their longest member."""
    total = sum(len(b) * max(lengths[i] for i in b) for b in bins if b)
    return total - sum(lengths[i] for b in bins for i in b), total


@dataclass(slots=True)
class MicroBatch:
    """Padded tensors of a few sequences. ``L`` is prompt+response length, ``T`` the response part.

    ``response_start_B`` is where each response begins in ``input_ids_BL``; the log-prob of
    response token t comes from the logits at position response_start + t − 1. ``mask_BT`` is
    1 on the model's response tokens only (response positions × loss mask): every loss and
    estimator reads it, so padding and observation tokens count for nothing.
    ``response_lens`` holds each response's full length, observation tokens included.
    """

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    response_start_B: torch.Tensor
    mask_BT: torch.Tensor
    behav_logp_BT: torch.Tensor
    token_rewards_BT: torch.Tensor
    index: list[int] = field(default_factory=list)  # positions of these samples in the batch
    response_lens: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask_BL.sum())


def collate(samples: list[TrainSample], index: list[int], pad_id: int) -> MicroBatch:
    chosen = [samples[i] for i in index]
    L = max(s.length for s in chosen)
    T = max(max(len(s.response_ids) for s in chosen), 1)
    B = len(chosen)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    mask = torch.zeros((B, T))
    behav = torch.zeros((B, T))
    rewards = torch.zeros((B, T))
    starts = torch.zeros(B, dtype=torch.long)
    for b, s in enumerate(chosen):
        ids = s.prompt_ids + s.response_ids
        n = len(s.response_ids)
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        starts[b] = len(s.prompt_ids)
        mask[b, :n] = torch.tensor(s.model_mask, dtype=torch.float32)
        behav[b, :n] = torch.tensor(s.behav_logp, dtype=torch.float32)
        rewards[b, :n] = torch.tensor(s.token_rewards, dtype=torch.float32)
    return MicroBatch(
        input_ids, attention, starts, mask, behav, rewards, list(index), [len(s.response_ids) for s in chosen]
    )


def dummy_micro_batch(pad_id: int) -> MicroBatch:
    """A one-token micro-batch with an empty response mask.

    FSDP runs collectives inside forward and backward, so every rank must run the same number
    of micro-batches; a rank with fewer runs these, which contribute exactly zero loss.
    """
    return MicroBatch(
        input_ids_BL=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask_BL=torch.ones((1, 2), dtype=torch.long),
        response_start_B=torch.ones(1, dtype=torch.long),
        mask_BT=torch.zeros((1, 1)),
        behav_logp_BT=torch.zeros((1, 1)),
        token_rewards_BT=torch.zeros((1, 1)),
    )


def gather_response(values_BL: torch.Tensor, response_start_B: torch.Tensor, T: int) -> torch.Tensor:
    """Picks, for each response token t, the entry at position response_start + t − 1 (the one predicting it)."""
    B, L = values_BL.shape[:2]
    pos_BT = (response_start_B[:, None] - 1 + torch.arange(T)[None, :]).clamp(0, L - 1)
    pos_BT = pos_BT.to(values_BL.device)
    if values_BL.dim() == 2:
        return values_BL.gather(1, pos_BT)
    return values_BL.gather(1, pos_BT[..., None].expand(B, T, values_BL.shape[-1]))
