"""From trajectory groups to per-rank micro-batches.

Every rank receives the whole batch (rank 0 pulled it and broadcast it); each rank then takes
its shard, and cuts the shard into micro-batches under a token budget. A micro-batch is either
packed (verl's ``use_remove_padding``: its sequences one after another in a single row, positions
restarting at each, so attention stays inside each sequence and no token is padding) or padded
(one row per sequence, right-padded to the longest, so the budget counts padded tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relayrl.devices import upload
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


def pack_tokens(lengths: list[int], budget: int) -> list[list[int]]:
    """Groups indices into packed micro-batches of at most ``budget`` real tokens each (first fit,
    longest first: few, full rows). A sequence longer than the budget gets a row of its own."""
    bins: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fit = next((b for b, n in enumerate(used) if n + lengths[i] <= budget), None)
        if fit is None:
            bins.append([i])
            used.append(lengths[i])
        else:
            bins[fit].append(i)
            used[fit] += lengths[i]
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
    """The tokens of a few sequences, and their response tensors. ``L`` is a row's length, ``T``
    the longest response; ``B`` counts sequences, which are rows of ``input_ids_BL`` (padded) or
    all in its one row (packed: ``position_ids_BL`` restarts at 0 where each begins).

    ``response_start_B`` is where each response begins in its row (``row_B``; default: row b);
    the log-prob of response token t comes from the logits at position response_start + t − 1.
    ``mask_BT`` is 1 on the model's response tokens only (response positions × loss mask): every
    loss and estimator reads it, so padding and observation tokens count for nothing.
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
    position_ids_BL: torch.Tensor | None = None  # packed rows only
    row_B: torch.Tensor | None = None  # each sequence's row; None: sequence b is row b

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask_BL.sum())

    @property
    def packed(self) -> bool:
        return self.position_ids_BL is not None

    def model_inputs(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The model's keyword arguments. A packed row goes without an attention mask: transformers
        then reads where each sequence starts from ``position_ids`` and confines attention to it."""
        ids = upload(self.input_ids_BL, device)
        if self.position_ids_BL is not None:
            return {"input_ids": ids, "position_ids": upload(self.position_ids_BL, device)}
        return {"input_ids": ids, "attention_mask": upload(self.attention_mask_BL, device)}

    def rows(self) -> torch.Tensor:
        B = self.response_start_B.shape[0]
        return self.row_B if self.row_B is not None else torch.arange(B)

    def response_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(sequence b, response index t) of every response token, observation tokens included and
        padding left out, as two host tensors: the positions whose log-probs anything reads. One
        micro-batch's ``[B, T]`` rectangle spans its longest response, so with responses of mixed
        lengths most of it can be padding. A micro-batch without a response token (the dummy, which
        has no ``response_lens``) gives its first position: every rank must run the output head for
        FSDP's gradient collectives to match."""
        B, T = self.mask_BT.shape
        lens_B = torch.tensor(self.response_lens or [T] * B, dtype=torch.long)
        count = int(lens_B.sum())
        if count == 0:
            return torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
        b_N = torch.repeat_interleave(torch.arange(B), lens_B)
        starts_B = torch.cumsum(lens_B, 0) - lens_B
        return b_N, torch.arange(count) - starts_B[b_N]


def _response_tensors(chosen: list[TrainSample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask, behaviour log-probs, token rewards), each [B, T]."""
    T = max(max(len(s.response_ids) for s in chosen), 1)
    mask, behav, rewards = (torch.zeros((len(chosen), T)) for _ in range(3))
    for b, s in enumerate(chosen):
        n = len(s.response_ids)
        mask[b, :n] = torch.tensor(s.model_mask, dtype=torch.float32)
        behav[b, :n] = torch.tensor(s.behav_logp, dtype=torch.float32)
        rewards[b, :n] = torch.tensor(s.token_rewards, dtype=torch.float32)
    return mask, behav, rewards


def collate(samples: list[TrainSample], index: list[int], pad_id: int) -> MicroBatch:
    """One right-padded row per sequence."""
    chosen = [samples[i] for i in index]
    L = max(s.length for s in chosen)
    B = len(chosen)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    starts = torch.zeros(B, dtype=torch.long)
    for b, s in enumerate(chosen):
        ids = s.prompt_ids + s.response_ids
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        starts[b] = len(s.prompt_ids)
    mask, behav, rewards = _response_tensors(chosen)
    return MicroBatch(
        input_ids, attention, starts, mask, behav, rewards, list(index), [len(s.response_ids) for s in chosen]
    )


def collate_packed(samples: list[TrainSample], index: list[int]) -> MicroBatch:
    """The sequences one after another in one row, positions restarting at each: no padding."""
    chosen = [samples[i] for i in index]
    ids: list[int] = []
    positions: list[int] = []
    starts = torch.zeros(len(chosen), dtype=torch.long)
    for b, s in enumerate(chosen):
        starts[b] = len(ids) + len(s.prompt_ids)
        positions.extend(range(s.length))
        ids.extend(s.prompt_ids + s.response_ids)
    mask, behav, rewards = _response_tensors(chosen)
    return MicroBatch(
        input_ids_BL=torch.tensor([ids], dtype=torch.long),
        attention_mask_BL=torch.ones((1, len(ids)), dtype=torch.long),
        response_start_B=starts,
        mask_BT=mask,
        behav_logp_BT=behav,
        token_rewards_BT=rewards,
        index=list(index),
        response_lens=[len(s.response_ids) for s in chosen],
        position_ids_BL=torch.tensor([positions], dtype=torch.long),
        row_B=torch.zeros(len(chosen), dtype=torch.long),
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


def gather_response(
    values_RL: torch.Tensor, response_start_B: torch.Tensor, T: int, row_B: torch.Tensor | None = None
) -> torch.Tensor:
    """Picks, for each sequence b and response token t, the entry of row ``row_B[b]`` (default: b)
    at position response_start + t − 1 (the one predicting it): [B, T] or [B, T, H]. Positions past
    a short response are clamped into the row (their mask is 0)."""
    L, device = values_RL.shape[1], values_RL.device
    pos_BT = upload((response_start_B[:, None] - 1 + torch.arange(T)[None, :]).clamp(0, L - 1), device)
    rows = row_B if row_B is not None else torch.arange(response_start_B.shape[0])
    return values_RL[upload(rows, device)[:, None], pos_BT]
