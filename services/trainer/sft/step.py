"""One SFT optimizer step: shard the batch over ranks, cut micro-batches, token-mean cross-entropy.

The loss is the mean negative log-likelihood over every trained token of the whole batch (all
ranks, all micro-batches): each micro-batch contributes its token sum divided by the batch's
trained-token count, which every rank knows because every rank holds the whole batch. So N
ranks and any micro-batch size take the same step as one rank with the batch in one piece.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relayrl.devices import upload
from services.trainer import distributed as D
from services.trainer.batching import pack_by_count, shard
from services.trainer.losses import Normaliser, aggregate
from services.trainer.model import clip_and_step, last_hidden, logprobs_at, scattered
from services.trainer.sft.data import SftExample


@dataclass(slots=True)
class SftMicroBatch:
    """Right-padded sequences; ``loss_mask_BL`` is 0 on padding."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    loss_mask_BL: torch.Tensor

    def model_inputs(self, device: torch.device) -> dict[str, torch.Tensor]:
        ids, attention = upload(self.input_ids_BL, device), upload(self.attention_mask_BL, device)
        return {"input_ids": ids, "attention_mask": attention}


@dataclass(frozen=True, slots=True)
class StepResult:
    loss: float  # token-mean NLL over the whole batch, before the update
    grad_norm: float
    lr: float  # the rate this step's update used
    trained_tokens: int  # tokens the loss is averaged over, whole batch
    tokens: int  # all non-padding tokens forwarded, whole batch
    stepped: bool  # False when a non-finite gradient norm skipped the update


def collate(examples: list[SftExample], pad_id: int) -> SftMicroBatch:
    L = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), L), dtype=torch.long)
    mask = torch.zeros((len(examples), L))
    for b, e in enumerate(examples):
        n = len(e.input_ids)
        ids[b, :n] = torch.tensor(e.input_ids)
        attention[b, :n] = 1
        mask[b, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
    return SftMicroBatch(ids, attention, mask)


def token_nll(model: nn.Module, mb: SftMicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(−log p of each next token, its loss mask), both [B, L−1]: position t predicts token t+1.

    From the hidden states and the output head a chunk of tokens at a time, as the RL trainer's
    log-probs (:func:`services.trainer.model.logprobs_at`): the whole logits never exist, and
    positions the loss does not train get 0 without meeting the head.
    """
    hidden_BLH = last_hidden(model, mb)
    B, L, _ = hidden_BLH.shape
    mask_BT = mb.loss_mask_BL[:, 1:]
    b_N, t_N = mask_BT.nonzero(as_tuple=True)
    if not len(b_N):
        # A micro-batch with no trained token still sends one position: every rank must run the
        # head for FSDP's collectives.
        b_N, t_N = torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    logp_N, _ = logprobs_at(model, hidden_BLH, b_N, t_N, mb.input_ids_BL[b_N, t_N + 1], 1.0, with_entropy=False)
    device = hidden_BLH.device
    return scattered(-logp_N, upload(b_N * (L - 1) + t_N, device), (B, L - 1)), upload(mask_BT, device)


def micro_loss(model: nn.Module, mb: SftMicroBatch, batch_trained_tokens: int) -> torch.Tensor:
    """This micro-batch's share of the batch's token-mean loss."""
    nll_BT, mask_BT = token_nll(model, mb)
    return aggregate(nll_BT, mask_BT, "token-mean", Normaliser(tokens=float(batch_trained_tokens), sequences=0.0))


def train_step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
    batch: list[SftExample],
    micro_batch_size: int,
    clip_grad: float,
    pad_id: int,
) -> StepResult:
    """One update on ``batch`` (the whole step's sequences, identical on every rank)."""
    world = D.world_size()
    lengths = [len(e.input_ids) for e in batch]
    mine = shard(len(batch), lengths, D.get_rank(), world)
    trained = sum(e.trained_tokens for e in batch)
    loss_sum = torch.zeros(())
    # Length-sorted runs pad little; with equal shards every rank runs as many micro-batches,
    # which FSDP's collectives need.
    for run in pack_by_count([lengths[i] for i in mine], micro_batch_size):
        share = micro_loss(model, collate([batch[mine[j]] for j in run], pad_id), trained)
        # FSDP averages gradients over ranks; the share is already of the global mean.
        (share * world).backward()
        loss_sum += share.detach().cpu()
    loss = float(D.all_reduce(loss_sum.reshape(1))[0])
    lr = sched.get_last_lr()[0]
    grad_norm, stepped = clip_and_step(model, opt, clip_grad)
    sched.step()
    return StepResult(loss, grad_norm, lr, trained, sum(lengths), stepped)
