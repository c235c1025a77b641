"""One training step on the tiny model, in one process without a process group."""

import math

import pytest
import torch

from services.trainer.batching import TrainSample, collate
from services.trainer.config import TrainerSettings
from services.trainer.model import AdamW, LrSchedule, build_optimizer, load_actor, load_critic, policy_forward
from services.trainer.step import Models, train_step


def _models(model_dir, critic=False):
    torch.manual_seed(0)
    actor = load_actor(model_dir, torch.device("cpu"))
    opt, sched = build_optimizer(actor, AdamW(1e-3), LrSchedule())
    models = Models(actor, opt, sched)
    if critic:
        models.critic = load_critic(model_dir, torch.device("cpu"), 0)
        models.critic_opt, models.critic_sched = build_optimizer(models.critic, AdamW(1e-3), LrSchedule())
    return models


def _samples(lengths, behav=-1.0):
    return [
        TrainSample(
            i // 2, [5, 6, 7], [10 + i] * n, [behav] * n, [0.0] * (n - 1) + [float(i % 2)] if n else [], i % 2, 0
        )
        for i, n in enumerate(lengths)
    ]


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_logprobs_are_those_of_the_tokens_at_temperature(tiny_model_dir):
    torch.set_num_threads(1)
    model = load_actor(tiny_model_dir, torch.device("cpu"))
    samples = _samples([3, 1])
    mb = collate(samples, [0, 1], pad_id=0)
    with torch.no_grad():
        got = policy_forward(model, mb, temperature=0.5, with_entropy=False).logp_BT
        logits = model(input_ids=mb.input_ids_BL[:1, :6]).logits[0] / 0.5
    expected = torch.log_softmax(logits, -1)[[2, 3, 4], [10, 10, 10]]
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=0)


def test_empty_response_mask_skips_the_step(tiny_model_dir):
    models = _models(tiny_model_dir)
    before = _params(models.actor)
    metrics = train_step(models, _samples([0, 0, 0, 0]), TrainerSettings(), pad_id=0)
    assert metrics == {"trainer/skipped_empty_batch": 1.0}
    assert torch.equal(before, _params(models.actor))


@pytest.mark.parametrize(
    ("estimator", "variant"),
    [
        ("grpo", "decoupled"),
        ("rloo", "tis"),
        ("reinforce_plus_plus", "cispo"),
        ("gae", "vanilla"),
        ("grpo", "topr"),
        ("rloo", "kimi15"),
    ],
)
def test_a_step_updates_weights_with_finite_metrics(tiny_model_dir, estimator, variant):
    models = _models(tiny_model_dir, critic=estimator == "gae")
    before = _params(models.actor)
    # behaviour log-probs far from the model's make every importance weight extreme
    settings = TrainerSettings(adv_estimator=estimator, pg_variant=variant, ppo_mini_batches=2, micro_batch_tokens=16)
    metrics = train_step(models, _samples([3, 1, 2, 0]), settings, pad_id=0)
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert not torch.equal(before, _params(models.actor))
    assert metrics["actor/grad_norm"] > 0
    if estimator == "gae":
        assert "critic/vf_loss" in metrics and "critic/vf_explained_var" in metrics


def _grads_seen_by_the_optimizer(models):
    """Records the actor's gradients each time its optimizer steps."""
    seen = []
    models.actor_opt.register_step_pre_hook(
        lambda *_: seen.append(torch.cat([p.grad.detach().flatten() for p in models.actor.parameters()]))
    )
    return seen


def _count_actor_forwards(models):
    calls = [0]
    models.actor.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


# A long-tailed mix of response lengths, as RL answers are: most short, a few long.
LONG_TAIL = [2, 3, 3, 4, 4, 5, 6, 8, 9, 12, 15, 40]


def test_dynamic_batching_gives_the_loss_and_gradients_of_one_plain_micro_batch(tiny_model_dir):
    results = {}
    # Padded micro-batches (packing is the default): what this test measures is their padding.
    for name, settings in {
        "dynamic": TrainerSettings(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=48, use_remove_padding=False),
        "plain": TrainerSettings(
            use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=len(LONG_TAIL), use_remove_padding=False
        ),
    }.items():
        models = _models(tiny_model_dir)
        grads = _grads_seen_by_the_optimizer(models)
        forwards = _count_actor_forwards(models)
        metrics = train_step(models, _samples(LONG_TAIL, behav=-5.0), settings, pad_id=0)
        results[name] = (metrics, grads[0], forwards[0], _params(models.actor))
    dynamic, plain = results["dynamic"], results["plain"]
    assert dynamic[2] > 3 * plain[2]  # really several micro-batches against one
    for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/pg_clipfrac"):
        assert dynamic[0][key] == pytest.approx(plain[0][key], abs=1e-5), key
    torch.testing.assert_close(dynamic[1], plain[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(dynamic[3], plain[3], atol=1e-5, rtol=0)
    # Similar lengths together: far less padding than one micro-batch padded to the longest.
    assert dynamic[0]["perf/padding_ratio"] < plain[0]["perf/padding_ratio"] / 3
    lengths = [3 + n for n in LONG_TAIL]
    assert plain[0]["perf/padding_ratio"] == pytest.approx(1 - sum(lengths) / (len(lengths) * max(lengths)))


@pytest.mark.parametrize(
    ("variant", "extra"),
    [("decoupled", {}), ("vanilla", {"use_kl_loss": True}), ("tis", {"adv_estimator": "gae"})],
)
def test_skipping_the_old_log_prob_forward_changes_no_loss_or_gradient(tiny_model_dir, variant, extra):
    results = {}
    for mode in ("auto", "always"):
        models = _models(tiny_model_dir, critic=extra.get("adv_estimator") == "gae")
        if extra.get("use_kl_loss"):
            models.ref = load_actor(tiny_model_dir, torch.device("cpu"))
        grads = _grads_seen_by_the_optimizer(models)
        forwards = _count_actor_forwards(models)
        settings = TrainerSettings(pg_variant=variant, recompute_old_log_prob=mode, micro_batch_tokens=48, **extra)
        metrics = train_step(models, _samples(LONG_TAIL, behav=-5.0), settings, pad_id=0)
        results[mode] = (metrics, grads[0], forwards[0], _params(models.actor))
    auto, always = results["auto"], results["always"]
    assert auto[2] * 2 == always[2]  # the no-grad forward over every micro-batch is gone
    assert auto[0].keys() == always[0].keys()
    for key, value in always[0].items():
        if not key.startswith(("timing/", "timing_s/")):
            assert auto[0][key] == pytest.approx(value, abs=1e-7, rel=0), key
    assert torch.equal(auto[1], always[1])
    assert torch.equal(auto[3], always[3])


@pytest.mark.parametrize("extra", [{"ppo_mini_batches": 2}, {"use_kl_in_reward": True}])
def test_the_old_log_prob_forward_stays_where_it_is_needed(tiny_model_dir, extra):
    counts = {}
    for mode in ("auto", "always"):
        models = _models(tiny_model_dir)
        if extra.get("use_kl_in_reward"):
            models.ref = load_actor(tiny_model_dir, torch.device("cpu"))
        forwards = _count_actor_forwards(models)
        settings = TrainerSettings(recompute_old_log_prob=mode, micro_batch_tokens=48, **extra)
        train_step(models, _samples(LONG_TAIL), settings, pad_id=0)
        counts[mode] = forwards[0]
    assert counts["auto"] == counts["always"]


def test_micro_batch_tokens_is_the_former_name_of_the_token_budget():
    assert TrainerSettings(micro_batch_tokens=100).ppo_max_token_len_per_gpu == 100
    with pytest.raises(ValueError, match="not both"):
        TrainerSettings(micro_batch_tokens=100, ppo_max_token_len_per_gpu=200)


def test_mismatch_correction_reports_its_metrics_and_trains(tiny_model_dir):
    models = _models(tiny_model_dir)
    before = _params(models.actor)
    settings = TrainerSettings(
        pg_variant="decoupled",
        rollout_is=True,
        rollout_is_threshold=2.0,
        rollout_is_mode="mask",
        rollout_is_level="token",
    )
    # behaviour log-probs of −1 are far from the tiny model's: most tokens fall outside [0.5, 2].
    metrics = train_step(models, _samples([3, 1, 2, 2]), settings, pad_id=0)
    assert 0.0 < metrics["mismatch/masked_frac"] <= 1.0
    assert metrics["overlong/truncated_frac"] == 0.0
    assert metrics["mismatch/ratio_q05"] <= metrics["mismatch/ratio_q50"] <= metrics["mismatch/ratio_q95"]
    if metrics["mismatch/masked_frac"] < 1.0:
        assert not torch.equal(before, _params(models.actor))


def test_overlong_filter_gives_truncated_responses_no_loss(tiny_model_dir):
    samples = _samples([3, 1, 2, 2])
    for x in samples:
        x.truncated = True
    models = _models(tiny_model_dir)
    before = _params(models.actor)
    metrics = train_step(models, samples, TrainerSettings(overlong_filter=True), pad_id=0)
    assert metrics["overlong/truncated_frac"] == 1.0
    assert metrics["actor/grad_norm"] == 0.0
    assert torch.equal(before, _params(models.actor))
    unfiltered = train_step(_models(tiny_model_dir), samples, TrainerSettings(), pad_id=0)
    assert unfiltered["actor/grad_norm"] > 0


def _vanilla_pg_loss_over(adv_BT, weight_BT, keep_BT):
    """verl's token-mean of −A·w at ratio 1 (the first update of a step) over the kept tokens only."""
    return float(-(adv_BT * weight_BT * keep_BT).sum() / keep_BT.sum())


def test_filtered_responses_leave_the_loss_normaliser(tiny_model_dir):
    from services.trainer import advantages as adv_lib

    samples = _samples([3, 1, 2, 2])
    samples[1].truncated = samples[2].truncated = True
    settings = TrainerSettings(pg_variant="vanilla", overlong_filter=True, loss_agg_mode="token-mean")
    metrics = train_step(_models(tiny_model_dir), samples, settings, pad_id=0)
    full = collate(samples, list(range(len(samples))), pad_id=0)
    adv = adv_lib.grpo(torch.tensor([float(x.reward) for x in samples]), full.mask_BT, [x.group for x in samples])
    keep = full.mask_BT.float() * torch.tensor([1.0, 0.0, 0.0, 1.0]).unsqueeze(-1)
    # 5 kept tokens: dividing by all 8 response tokens would shrink the loss by 5/8.
    assert metrics["actor/pg_loss"] == pytest.approx(_vanilla_pg_loss_over(adv, torch.ones_like(adv), keep), abs=1e-6)


def _sampled_apart(model_dir, shift):
    """Samples whose engine log-probs are the trainer's own at token t plus ``shift(t)`` nats; with
    their collated batch and the trainer's log-probs."""
    samples = _samples([3, 1, 2, 2])
    full = collate(samples, list(range(len(samples))), pad_id=0)
    with torch.no_grad():
        prox = policy_forward(_models(model_dir).actor, full, 1.0, with_entropy=False).logp_BT
    for b, x in enumerate(samples):
        x.behav_logp = [float(prox[b, t]) + shift(t) for t in range(len(x.response_ids))]
    return samples, collate(samples, list(range(len(samples))), pad_id=0), prox


def test_icepop_masked_tokens_leave_the_loss_normaliser(tiny_model_dir):
    from services.trainer import advantages as adv_lib
    from services.trainer.correction import CorrectionConfig, correction_weights

    # The engine's log-probs: the trainer's own on even tokens (ρ = 1, kept), 2 nats higher on odd
    # ones (ρ = e⁻² < 1/2, masked by IcePop's [1/2, 2]).
    samples, full, prox = _sampled_apart(tiny_model_dir, lambda t: 2.0 * (t % 2))
    corr = correction_weights(prox, full.behav_logp_BT, full.mask_BT, CorrectionConfig(mode="mask", threshold=2.0))
    assert float(corr.keep_BT.sum()) == 5.0 and float(full.mask_BT.sum()) == 8.0
    common = dict(pg_variant="vanilla", rollout_is_threshold=2.0, rollout_is_mode="mask", rollout_is_level="token")
    metrics = train_step(_models(tiny_model_dir), samples, TrainerSettings(rollout_is=True, **common), pad_id=0)
    adv = adv_lib.grpo(torch.tensor([float(x.reward) for x in samples]), full.mask_BT, [x.group for x in samples])
    assert metrics["mismatch/masked_frac"] == pytest.approx(3 / 8)
    assert metrics["actor/pg_loss"] == pytest.approx(_vanilla_pg_loss_over(adv, corr.weight_BT, corr.keep_BT), abs=1e-5)
    # Without rollout_is the same threshold only reports: every token stays in the loss, unweighted.
    metrics_only = train_step(_models(tiny_model_dir), samples, TrainerSettings(**common), pad_id=0)
    assert metrics_only["mismatch/masked_frac"] == pytest.approx(3 / 8)
    everything = full.mask_BT.float()
    assert metrics_only["actor/pg_loss"] == pytest.approx(
        _vanilla_pg_loss_over(adv, torch.ones_like(adv), everything), abs=1e-5
    )


def test_rollout_log_probs_anchor_ppos_clip_at_the_policy_that_sampled(tiny_model_dir):
    from services.trainer import advantages as adv_lib

    # The engine sampled every token at one nat below the trainer's policy now: since then the ratio
    # π/π_behav has grown to e, past PPO's 1 + 0.2, as after one large update at η = 1.
    samples, full, _ = _sampled_apart(tiny_model_dir, lambda t: -1.0)
    mask = full.mask_BT.float()
    adv = adv_lib.grpo(torch.tensor([float(x.reward) for x in samples]), full.mask_BT, [x.group for x in samples])
    settings = TrainerSettings(pg_variant="vanilla", use_rollout_log_probs=True, loss_agg_mode="token-mean")
    bypass = train_step(_models(tiny_model_dir), samples, settings, pad_id=0)
    # Tokens with A > 0 are clipped at 1.2 (no gradient pushes them further); those with A < 0 keep −A·e.
    positive = (adv > 0).float() * mask
    assert bypass["actor/pg_clipfrac"] == pytest.approx(float(positive.sum() / mask.sum()), abs=1e-6)
    per_token = torch.where(adv > 0, -adv * 1.2, -adv * math.e)
    assert bypass["actor/pg_loss"] == pytest.approx(float((per_token * mask).sum() / mask.sum()), abs=1e-5)
    # Anchored at the trainer's own policy (the default), one update per batch never clips.
    own = train_step(_models(tiny_model_dir), samples, TrainerSettings(pg_variant="vanilla"), pad_id=0)
    assert own["actor/pg_clipfrac"] == 0.0


def test_rollout_log_probs_refuse_a_second_correction():
    with pytest.raises(ValueError, match="set rollout_is false"):
        TrainerSettings(use_rollout_log_probs=True, rollout_is=True, rollout_is_threshold=2.0)
    with pytest.raises(ValueError, match="cispo already takes its ratio against the engine's log-probs"):
        TrainerSettings(use_rollout_log_probs=True, pg_variant="cispo")
    assert TrainerSettings(use_rollout_log_probs=True, pg_variant="decoupled").use_rollout_log_probs
