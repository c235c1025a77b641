"""One training step on the tiny model, in one process without a process group."""

import math

import pytest
import torch

from services.trainer.batching import TrainSample, collate
from services.trainer.config import TrainerSettings
from services.trainer.model import build_optimizer, load_actor, load_critic, policy_forward
from services.trainer.step import Models, train_step


def _models(model_dir, critic=False):
    torch.manual_seed(0)
    actor = load_actor(model_dir, torch.device("cpu"))
    opt, sched = build_optimizer(actor, 1e-3, 0.0, 0)
    models = Models(actor, opt, sched)
    if critic:
        models.critic = load_critic(model_dir, torch.device("cpu"), 0)
        models.critic_opt, models.critic_sched = build_optimizer(models.critic, 1e-3, 0.0, 0)
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
