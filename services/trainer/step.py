"""One training step on one batch: recompute proximal/reference log-probs and values,
compute advantages over the whole batch, then update actor (and critic) mini-batch by
mini-batch. Runs identically on every rank; each rank forwards only its shard."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch import nn

from relayrl.devices import upload
from services.trainer import advantages as adv_lib
from services.trainer import distributed as D
from services.trainer.batching import (
    MicroBatch,
    TrainSample,
    collate,
    collate_packed,
    dummy_micro_batch,
    pack,
    pack_by_count,
    pack_tokens,
    padding_tokens,
    shard,
)
from services.trainer.config import TrainerSettings
from services.trainer.correction import CorrectionConfig, correction_weights
from services.trainer.losses import (
    Normaliser,
    PolicyLossConfig,
    aggregate,
    explained_variance,
    kl_estimate,
    policy_loss,
    value_loss,
)
from services.trainer.model import ModelOptions, clip_and_step, fuses_logit_stats, policy_forward, value_forward
from services.trainer.perf import synchronize


@dataclass
class Models:
    actor: nn.Module
    actor_opt: torch.optim.Optimizer
    actor_sched: torch.optim.lr_scheduler.LRScheduler
    critic: nn.Module | None = None
    critic_opt: torch.optim.Optimizer | None = None
    critic_sched: torch.optim.lr_scheduler.LRScheduler | None = None
    ref: nn.Module | None = None


@dataclass(slots=True)
class Plan:
    """This rank's micro-batches for one mini-batch, and the global normaliser of that mini-batch."""

    micro: list[MicroBatch]
    norm: Normaliser
    rows: list[int]  # the mini-batch's rows of the whole batch, every rank's
    padding: int = 0  # padding tokens in this rank's micro-batches (dummies aside)
    padded_total: int = 0  # all tokens in them, padding included


def loss_config(s: TrainerSettings) -> PolicyLossConfig:
    return PolicyLossConfig(
        variant=s.pg_variant,
        clip_ratio_low=s.clip_ratio_low,
        clip_ratio_high=s.clip_ratio_high,
        clip_ratio_c=s.clip_ratio_c,
        is_cap=s.is_cap,
        cispo_eps_low=s.cispo_eps_low,
        cispo_eps_high=s.cispo_eps_high,
        topr_positive_weight=s.topr_positive_weight,
        topr_negative_weight=s.topr_negative_weight,
        kimi15_tau=s.kimi15_tau,
    )


def correction_config(s: TrainerSettings) -> CorrectionConfig | None:
    if s.rollout_is_threshold is None:
        return None
    return CorrectionConfig(
        level=s.rollout_is_level,
        mode=s.rollout_is_mode,
        threshold=s.rollout_is_threshold,
        threshold_lower=s.rollout_is_threshold_lower,
        veto_threshold=s.rollout_is_veto_threshold,
    )


def mini_batches(samples: list[TrainSample], count: int) -> list[list[int]]:
    """Splits samples into ``count`` mini-batches along group boundaries (whole groups stay together)."""
    groups = sorted({s.group for s in samples})
    per = max(1, math.ceil(len(groups) / count))
    chunks = [set(groups[i : i + per]) for i in range(0, len(groups), per)]
    return [[i for i, s in enumerate(samples) if s.group in chunk] for chunk in chunks]


def plan_mini_batch(samples: list[TrainSample], index: list[int], s: TrainerSettings, pad_id: int) -> Plan:
    lengths = [samples[i].length for i in index]
    mine = [index[j] for j in shard(len(index), lengths, D.get_rank(), D.world_size())]
    my_lengths = [samples[i].length for i in mine]
    packed = s.resolved_use_remove_padding
    if s.use_dynamic_bsz:
        budget = s.ppo_max_token_len_per_gpu
        bins = pack_tokens(my_lengths, budget) if packed else pack(my_lengths, budget)
    else:
        bins = pack_by_count(my_lengths, s.ppo_micro_batch_size_per_gpu)
    if packed:
        padding, padded_total = 0, sum(my_lengths)
        micro = [collate_packed(samples, [mine[j] for j in b]) for b in bins]
    else:
        padding, padded_total = padding_tokens(my_lengths, bins)
        micro = [collate(samples, [mine[j] for j in b], pad_id) for b in bins]
    # Every rank must run as many forward/backward passes as the busiest one (FSDP collectives).
    most = int(D.all_reduce(torch.tensor([len(micro)]), op="max").item())
    micro += [dummy_micro_batch(pad_id) for _ in range(most - len(micro))]
    chosen = [samples[i] for i in index]
    return Plan(
        micro=micro,
        norm=Normaliser(
            tokens=float(sum(x.model_tokens for x in chosen)),
            sequences=float(sum(1 for x in chosen if x.model_tokens)),
        ),
        rows=list(index),
        padding=padding,
        padded_total=padded_total,
    )


def loss_mask(
    full: MicroBatch, samples: list[TrainSample], s: TrainerSettings, keep_BT: torch.Tensor | None
) -> torch.Tensor:
    """The response tokens the policy loss is taken over (and normalised by): the overlong filter
    drops truncated responses, mismatch correction its masked and vetoed tokens."""
    mask = full.mask_BT.float()
    if s.overlong_filter:
        kept = torch.tensor([0.0 if x.truncated else 1.0 for x in samples])
        mask = mask * kept.unsqueeze(-1)
    if keep_BT is not None:
        mask = mask * keep_BT
    return mask


def loss_normaliser(mask_NT: torch.Tensor, rows: list[int]) -> Normaliser:
    """The counts of ``rows`` under ``mask_NT`` (a sequence with no token left counts for nothing)."""
    per_seq = mask_NT[rows].sum(-1)
    return Normaliser(tokens=float(per_seq.sum()), sequences=float((per_seq > 0).sum()))


def _rows(full_NT: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    T = mb.mask_BT.shape[1]
    if not mb.index:
        return torch.zeros_like(mb.mask_BT)
    return full_NT[mb.index, :T]


def skips_old_log_prob(plans: list[Plan], s: TrainerSettings) -> bool:
    """Whether the update's own forward can give the proximal log-probs (no separate forward).

    With one mini-batch (and one epoch, the only kind here) every micro-batch's forward runs
    on the weights before this step's single optimizer step, so its detached log-probs are
    exactly the proximal ones (verl's ``on_policy`` rule in its actor update). An in-reward KL
    needs them before the update, to compute advantages, and so do the mismatch-correction
    weights (and their metrics); both keep the forward.
    """
    return (
        s.recompute_old_log_prob == "auto"
        and len(plans) == 1
        and not s.use_kl_in_reward
        and correction_config(s) is None
    )


def _rows_of(mb: MicroBatch, t_BT: torch.Tensor) -> dict[int, list[float]]:
    """Each sample's entries over its whole response, observation tokens included, so that a
    row keeps its positions (the mask has holes in a multi-turn episode)."""
    rows = t_BT.detach().float().cpu()
    return {i: rows[b, : mb.response_lens[b]].tolist() for b, i in enumerate(mb.index)}


def _gather_rows(mine: dict[str, dict[int, list[float]]], n: int, T: int) -> dict[str, torch.Tensor]:
    """Each rank's rows of named [N, T] tensors, all-gathered into full tensors on every rank."""
    full: dict[str, torch.Tensor] = {}
    for part in D.all_gather_objects(dict(mine)):
        for name, rows in part.items():
            full.setdefault(name, torch.zeros(n, T))
            for i, row in rows.items():
                full[name][i, : len(row)] = torch.tensor(row)
    return full


@torch.no_grad()
def recompute(
    models: Models, plans: list[Plan], n: int, T: int, settings: TrainerSettings, with_prox: bool = True
) -> dict[str, torch.Tensor]:
    """Proximal log-probs (the actor before this step's update; left out when ``with_prox`` is
    false), reference log-probs and old values, each as a full [N, T] tensor on every rank
    (each rank computed its shard; all-gathered)."""
    if not (with_prox or models.ref is not None or models.critic is not None):
        return {}
    # Read back once every pass is queued: one read per micro-batch would make the host wait for
    # each before it could queue the next.
    computed: list[tuple[MicroBatch, dict[str, torch.Tensor]]] = []
    for plan in plans:
        for mb in plan.micro:
            parts = {}
            if with_prox:
                parts["prox"] = policy_forward(models.actor, mb, settings.temperature, False).logp_BT
            if models.ref is not None:
                parts["ref"] = policy_forward(models.ref, mb, settings.temperature, False).logp_BT
            if models.critic is not None:
                parts["values"] = value_forward(models.critic, mb)
            computed.append((mb, parts))
    mine: dict[str, dict[int, list[float]]] = defaultdict(dict)
    for mb, parts in computed:
        for name, t_BT in parts.items():
            mine[name].update(_rows_of(mb, t_BT))
    return _gather_rows(mine, n, T)


def compute_advantages(
    batch: MicroBatch, samples: list[TrainSample], extras: dict[str, torch.Tensor], s: TrainerSettings
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(advantages [N, T], returns [N, T] for the critic or None, token rewards after the KL penalty)."""
    mask = batch.mask_BT
    rewards = batch.token_rewards_BT
    if s.use_kl_in_reward:
        rewards = rewards - s.kl_coef * kl_estimate(extras["prox"], extras["ref"], s.kl_penalty) * mask
    groups = [x.group for x in samples]
    scores = torch.where(mask > 0, rewards, torch.zeros_like(rewards)).sum(-1)
    if s.adv_estimator == "grpo":
        return adv_lib.grpo(scores, mask, groups, s.norm_adv_by_std), None, rewards
    if s.adv_estimator == "rloo":
        return adv_lib.rloo(scores, mask, groups), None, rewards
    if s.adv_estimator == "reinforce_plus_plus":
        return adv_lib.reinforce_plus_plus(rewards, mask, s.gamma), None, rewards
    advantages, returns = adv_lib.gae(rewards, extras["values"], mask, s.gamma, s.lam)
    return advantages, returns, rewards


class _Sums:
    """Token- or loss-weighted sums of statistics, reduced over ranks at the end.

    A statistic still on the device is added there: reading each back would make the host wait for
    its micro-batch's passes before it could queue the next, and the GPU idle while it did. The
    step reads them all back at once, in :meth:`reduced`.
    """

    def __init__(self) -> None:
        self.values: dict[str, float | torch.Tensor] = defaultdict(float)

    def add(self, key: str, value: torch.Tensor | float, weight: torch.Tensor | float = 1.0) -> None:
        if isinstance(value, torch.Tensor):
            value = value.detach().double()
        self.values[key] += value * weight

    def reduced(self) -> dict[str, float]:
        keys = sorted(self.values)
        on_device = [key for key in keys if isinstance(self.values[key], torch.Tensor)]
        read: dict[str, float] = {}
        if on_device:
            stacked = torch.stack([self.values[key].reshape(()) for key in on_device])  # type: ignore[union-attr]
            read = dict(zip(on_device, stacked.double().cpu().tolist(), strict=True))
        t = D.all_reduce(torch.tensor([read.get(k, self.values[k]) for k in keys], dtype=torch.float64))
        return dict(zip(keys, t.tolist(), strict=True))


def _clip_and_step(model: nn.Module, opt: torch.optim.Optimizer, max_norm: float, sums: _Sums) -> tuple[float, bool]:
    """:func:`clip_and_step`, timed."""
    started = time.perf_counter()
    norm, ok = clip_and_step(model, opt, max_norm)
    # Averaged over ranks by the final reduction.
    sums.values["timing/optimizer_s"] += (time.perf_counter() - started) / D.world_size()
    return norm, ok


def update_actor(
    models: Models,
    plan: Plan,
    adv: torch.Tensor,
    extras: dict[str, torch.Tensor],
    s: TrainerSettings,
    sums: _Sums,
    own_prox: dict[int, list[float]] | None = None,
) -> None:
    """One optimizer step over ``plan``; without ``extras["prox"]`` the proximal log-probs are
    this forward's own, detached (see ``skips_old_log_prob``), and their rows go to ``own_prox``."""
    cfg = loss_config(s)
    world = D.world_size()
    norm = loss_normaliser(extras["loss_mask"], plan.rows)
    # This forward's own proximal log-probs, read back once the update is queued (not per micro-batch).
    own: list[tuple[MicroBatch, torch.Tensor]] = []
    for mb in plan.micro:
        out = policy_forward(models.actor, mb, s.temperature, with_entropy=True)
        dev = out.logp_BT.device
        mask = upload(_rows(extras["loss_mask"], mb), dev)
        if "prox" in extras:
            prox = upload(_rows(extras["prox"], mb), dev)
        else:
            prox = out.logp_BT.detach()
            if own_prox is not None:
                own.append((mb, prox))
        correction = upload(_rows(extras["correction"], mb), dev) if s.rollout_is else None
        behav = upload(mb.behav_logp_BT, dev)
        pl = policy_loss(
            out.logp_BT,
            # Anchored at the engine's log-probs, decoupled PPO's weight π_prox/π_behav is 1: nothing counted twice.
            behav if s.use_rollout_log_probs else prox,
            behav,
            upload(_rows(adv, mb), dev),
            mask,
            cfg,
            score_BT=upload(_rows(extras["score"], mb), dev),
            correction_BT=correction,
        )
        pg_loss = aggregate(pl.loss_BT, mask, s.loss_agg_mode, norm)
        entropy = aggregate(out.entropy_BT, mask, s.loss_agg_mode, norm)
        loss = pg_loss - s.entropy_coeff * entropy
        if s.use_kl_loss:
            kl = aggregate(
                kl_estimate(out.logp_BT, upload(_rows(extras["ref"], mb), dev), s.kl_loss_type),
                mask,
                s.loss_agg_mode,
                norm,
            )
            loss = loss + s.kl_loss_coef * kl
            sums.add("actor/kl_loss", kl.detach())
        # FSDP averages gradients over ranks; the loss is already a share of the global mean.
        (loss * world).backward()
        ntok = mask.sum()
        sums.add("actor/pg_loss", pg_loss.detach())
        sums.add("actor/entropy", entropy.detach())
        sums.add("actor/pg_clipfrac", pl.clipfrac, ntok)
        sums.add("actor/pg_clipfrac_lower", pl.clipfrac_lower, ntok)
        sums.add("actor/ppo_kl", pl.ppo_kl, ntok)
        sums.add("actor/approx_kl", (kl_estimate(out.logp_BT.detach(), prox, "k3") * mask).sum())
        sums.add("_tokens", ntok)
    norm, ok = _clip_and_step(models.actor, models.actor_opt, s.grad_clip, sums)
    if own_prox is not None:
        for mb, prox in own:
            own_prox.update(_rows_of(mb, prox))
    sums.values["actor/grad_norm"] += norm / world if ok else 0.0
    sums.values["actor/nonfinite_grad_steps"] += 0.0 if ok else 1.0 / world


def update_critic(
    models: Models, plan: Plan, returns: torch.Tensor, extras: dict[str, torch.Tensor], s: TrainerSettings, sums: _Sums
) -> None:
    assert models.critic is not None and models.critic_opt is not None
    world = D.world_size()
    for mb in plan.micro:
        values = value_forward(models.critic, mb)
        dev = values.device
        mask = upload(mb.mask_BT, dev)
        vl = value_loss(
            values, upload(_rows(extras["values"], mb), dev), upload(_rows(returns, mb), dev), mask, s.cliprange_value
        )
        loss = aggregate(vl.loss_BT, mask, s.loss_agg_mode, plan.norm)
        (loss * world).backward()
        sums.add("critic/vf_loss", loss.detach())
        sums.add("critic/vf_clipfrac", vl.clipfrac, mask.sum())
    norm, ok = _clip_and_step(models.critic, models.critic_opt, s.grad_clip, sums)
    sums.values["critic/grad_norm"] += norm / world if ok else 0.0


# Response lengths of the warm-up's made-up samples: short, and longer than a flex_attention block
# (128 tokens), so packed rows hold several sequences of both kinds.
WARM_UP_RESPONSES = (24, 300)


def compiles(s: TrainerSettings) -> bool:
    """Whether the models compile kernels at their first passes: flex_attention, use_torch_compile,
    and on CUDA the log-probs' statistics over the vocabulary (``model.token_logprobs``)."""
    return ModelOptions.of(s).compiles or fuses_logit_stats(s.device)


def warm_up(models: Models, s: TrainerSettings, pad_id: int) -> bool:
    """Runs the passes of a step once on made-up samples, without an update, when the models compile
    (:func:`compiles`): the no-grad forward (proximal, reference, old values) and the forward and
    backward of the actor and critic, so that their graphs are built at start, while the rollout
    generates the first batch, and not inside the first steps. Every rank must call it (FSDP's
    collectives). The gradients are dropped; weights, optimizer state and random state are as
    before. Returns whether it ran."""
    if not compiles(s):
        return False
    responses = [WARM_UP_RESPONSES[i % 2] for i in range(2 * D.world_size())]
    samples = [TrainSample(i, [1] * 8, [1] * n, [0.0] * n, [0.0] * n, 0.0, 0) for i, n in enumerate(responses)]
    plan = plan_mini_batch(samples, list(range(len(samples))), s, pad_id)
    micro = plan.micro + ([dummy_micro_batch(pad_id)] if D.world_size() > 1 else [])
    device = next(models.actor.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with torch.no_grad():
            for mb in micro:
                policy_forward(models.actor, mb, s.temperature, False)
                if models.ref is not None:
                    policy_forward(models.ref, mb, s.temperature, False)
                if models.critic is not None:
                    value_forward(models.critic, mb)
        models.actor.train()
        for mb in micro:
            out = policy_forward(models.actor, mb, s.temperature, with_entropy=True)
            assert out.entropy_BT is not None
            (out.logp_BT.sum() + out.entropy_BT.sum()).mul(0.0).backward()
            if models.critic is not None:
                value_forward(models.critic, mb).sum().mul(0.0).backward()
    models.actor_opt.zero_grad(set_to_none=True)
    if models.critic_opt is not None:
        models.critic_opt.zero_grad(set_to_none=True)
    return True


def train_step(models: Models, samples: list[TrainSample], s: TrainerSettings, pad_id: int) -> dict[str, float]:
    """Trains on ``samples`` (the whole batch, identical on every rank); returns verl-named metrics.

    A batch without a single model token is skipped (``trainer/skipped_empty_batch`` = 1):
    there is nothing to learn from and every mean would divide by zero.
    """
    n_tokens = sum(x.model_tokens for x in samples)
    if n_tokens == 0:
        return {"trainer/skipped_empty_batch": 1.0}
    full = collate(samples, list(range(len(samples))), pad_id)
    plans = [plan_mini_batch(samples, idx, s, pad_id) for idx in mini_batches(samples, s.ppo_mini_batches)]
    n, T = len(samples), full.mask_BT.shape[1]
    skip = skips_old_log_prob(plans, s)
    extras = recompute(models, plans, n, T, s, with_prox=not skip)
    adv, returns, rewards = compute_advantages(full, samples, extras, s)
    extras["score"] = torch.tensor([x.reward for x in samples]).unsqueeze(-1).expand_as(full.mask_BT)
    recipe_metrics = {"overlong/truncated_frac": sum(x.truncated for x in samples) / len(samples)}
    keep = None
    if (ccfg := correction_config(s)) is not None:
        corr = correction_weights(extras["prox"], full.behav_logp_BT, full.mask_BT, ccfg)
        recipe_metrics |= corr.metrics
        if s.rollout_is:  # otherwise only the metrics: the loss stays as it is
            extras["correction"], keep = corr.weight_BT, corr.keep_BT
    extras["loss_mask"] = loss_mask(full, samples, s, keep)
    sums = _Sums()
    own_prox: dict[int, list[float]] = {}
    update_actor_s = 0.0  # what perf/mfu/actor divides by, as verl times its update_actor
    for plan in plans:
        sums.add("_padding", float(plan.padding))
        sums.add("_padded_total", float(plan.padded_total))
        models.actor.train()
        synchronize()
        started = time.perf_counter()
        update_actor(models, plan, adv, extras, s, sums, own_prox)
        synchronize()
        update_actor_s += time.perf_counter() - started
        if models.critic is not None and returns is not None:
            update_critic(models, plan, returns, extras, s, sums)
    if skip:
        extras["prox"] = _gather_rows({"prox": own_prox}, n, T)["prox"]
    models.actor_sched.step()
    if models.critic_sched is not None:
        models.critic_sched.step()
    summary = _summarise(sums.reduced(), len(plans), full, samples, extras, adv, returns, rewards, models)
    return summary | recipe_metrics | {"timing_s/update_actor": update_actor_s}


def _summarise(
    r: dict[str, float],
    n_plans: int,
    full: MicroBatch,
    samples: list[TrainSample],
    extras: dict[str, torch.Tensor],
    adv: torch.Tensor,
    returns: torch.Tensor | None,
    rewards: torch.Tensor,
    models: Models,
) -> dict[str, float]:
    mask = full.mask_BT
    tokens = max(r.pop("_tokens"), 1.0)
    padding, padded_total = r.pop("_padding"), r.pop("_padded_total")
    out = {
        k: v / n_plans
        for k, v in r.items()
        if k
        in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "critic/vf_loss", "actor/grad_norm", "critic/grad_norm")
    }
    for k in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/approx_kl", "critic/vf_clipfrac"):
        if k in r:
            out[k] = r[k] / tokens
    out["actor/nonfinite_grad_steps"] = r["actor/nonfinite_grad_steps"]
    out["timing/optimizer_s"] = r["timing/optimizer_s"]
    out["actor/lr"] = models.actor_sched.get_last_lr()[0]
    behav, prox = full.behav_logp_BT, extras["prox"]
    out["training/rollout_probs_diff_mean"] = float(adv_lib.masked_mean((behav.exp() - prox.exp()).abs(), mask))
    out["training/rollout_logprob_diff_mean"] = float(adv_lib.masked_mean(prox - behav, mask))
    # Off-policy drift as max_staleness auto reads it (services/trainer/staleness_control.py).
    out["training/rollout_logprob_abs_diff_mean"] = float(adv_lib.masked_mean((prox - behav).abs(), mask))
    out["critic/score/mean"] = sum(x.reward for x in samples) / len(samples)
    out["critic/rewards/mean"] = float((rewards * mask).sum(-1).mean())
    out["critic/advantages/mean"] = float(adv_lib.masked_mean(adv, mask))
    out["response_length/mean"] = float(mask.sum(-1).mean())
    out["trainer/batch_tokens"] = float(full.attention_mask_BL.sum())
    # Share of the tokens forwarded in micro-batches that are padding (compute spent on nothing).
    out["perf/padding_ratio"] = padding / max(padded_total, 1.0)
    if returns is not None:
        out["critic/vf_explained_var"] = float(explained_variance(extras["values"], returns, mask))
        out["critic/returns/mean"] = float(adv_lib.masked_mean(returns, mask))
    return out
