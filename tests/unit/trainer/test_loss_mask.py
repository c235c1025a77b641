"""Multi-turn episodes: observation tokens (loss_mask 0) change no loss, gradient or advantage.

Each check builds a batch whose responses mix model turns, observations and padding, then
scrambles every value that sits outside the model's tokens (log-probs, advantages, values,
rewards, weights) and requires the same result within 1e-6; where it is defined, the result
must also equal the same computation on the model's tokens alone, packed together.
"""

from __future__ import annotations

import pytest
import torch

from services.trainer import advantages as A
from services.trainer.batching import TrainSample, collate, samples_from_groups
from services.trainer.config import TrainerSettings
from services.trainer.correction import CorrectionConfig, correction_weights
from services.trainer.losses import Normaliser, PolicyLossConfig, aggregate, kl_estimate, policy_loss, value_loss
from services.trainer.step import compute_advantages, train_step
from tests.unit.trainer.test_step import _models, _params

# Two-turn episodes with padding, and a single-turn answer: 1 model, 0 observation or padding.
MASK = torch.tensor(
    [
        [1, 1, 1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 1, 1, 1, 0],
    ],
    dtype=torch.float32,
)
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
VARIANTS = ("vanilla", "decoupled", "tis", "cispo", "topr", "kimi15")


def _scrambled(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``x`` with every entry outside MASK replaced by an unrelated value."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(x.shape, generator=g) * 7 - 3
    return torch.where(MASK > 0, x, noise)


def _packed(x: torch.Tensor) -> torch.Tensor:
    """The model's tokens of each row of ``x``, moved to the front and zero-padded."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        kept = x[b][MASK[b] > 0]
        out[b, : kept.numel()] = kept
    return out


PACKED_MASK = _packed(MASK)


def _norm(mask: torch.Tensor) -> Normaliser:
    return Normaliser(tokens=float(mask.sum()), sequences=float((mask.sum(-1) > 0).sum()))


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = MASK.shape
    logp = -torch.rand(shape, generator=g) * 3
    return {
        "logp": logp,
        "prox": logp + torch.randn(shape, generator=g) * 0.3,
        "behav": logp + torch.randn(shape, generator=g) * 0.5,
        "adv": torch.randn(shape, generator=g),
        "correction": torch.rand(shape, generator=g) * 2,
        "score": torch.tensor([1.0, -0.5, 0.0, 2.0])[:, None].expand(shape).clone(),
    }


def _policy(inputs: dict[str, torch.Tensor], mask: torch.Tensor, variant: str, mode: str, corrected: bool):
    logp = inputs["logp"].clone().requires_grad_(True)
    out = policy_loss(
        logp,
        inputs["prox"],
        inputs["behav"],
        inputs["adv"],
        mask,
        PolicyLossConfig(variant=variant),
        score_BT=inputs["score"],
        correction_BT=inputs["correction"] if corrected else None,
    )
    loss = aggregate(out.loss_BT, mask, mode, _norm(mask))
    loss.backward()
    stats = torch.stack([out.clipfrac, out.clipfrac_lower, out.ppo_kl])
    return loss.detach(), logp.grad, stats


CASES = [(v, m, False) for v in VARIANTS for m in AGG_MODES] + [
    (v, m, True) for v in ("vanilla", "decoupled") for m in AGG_MODES
]


@pytest.mark.parametrize(("variant", "mode", "corrected"), CASES)
def test_policy_loss_ignores_observation_tokens(variant, mode, corrected):
    clean = _inputs()
    scrambled = {k: _scrambled(v, seed=i + 1) for i, (k, v) in enumerate(clean.items()) if k != "score"}
    scrambled["score"] = clean["score"]
    loss, grad, stats = _policy(clean, MASK, variant, mode, corrected)
    s_loss, s_grad, s_stats = _policy(scrambled, MASK, variant, mode, corrected)
    torch.testing.assert_close(s_loss, loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(s_grad, grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(s_stats, stats, atol=1e-6, rtol=0)
    assert torch.all(grad[MASK == 0] == 0)
    # The same loss as on the model's tokens alone, each gradient on its own token.
    p_loss, p_grad, p_stats = _policy({k: _packed(v) for k, v in clean.items()}, PACKED_MASK, variant, mode, corrected)
    torch.testing.assert_close(p_loss, loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(_packed(grad), p_grad, atol=1e-6, rtol=0)
    torch.testing.assert_close(p_stats, stats, atol=1e-6, rtol=0)


def _entropy_and_kl(entropy: torch.Tensor, logp: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, mode: str):
    entropy, logp = entropy.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    total = aggregate(entropy, mask, mode, _norm(mask))
    for kind in ("k1", "k2", "k3"):
        total = total + aggregate(kl_estimate(logp, ref, kind), mask, mode, _norm(mask))
    total.backward()
    return total.detach(), entropy.grad, logp.grad


@pytest.mark.parametrize("mode", AGG_MODES)
def test_entropy_and_kl_terms_ignore_observation_tokens(mode):
    g = torch.Generator().manual_seed(3)
    entropy, logp, ref = (
        torch.rand(MASK.shape, generator=g) * 4,
        -torch.rand(MASK.shape, generator=g),
        -torch.rand(MASK.shape, generator=g),
    )
    clean = _entropy_and_kl(entropy, logp, ref, MASK, mode)
    scrambled = _entropy_and_kl(_scrambled(entropy, 1), _scrambled(logp, 2), _scrambled(ref, 3), MASK, mode)
    packed = _entropy_and_kl(_packed(entropy), _packed(logp), _packed(ref), PACKED_MASK, mode)
    for got, want in zip(scrambled, clean, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(packed[0], clean[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(packed[2], _packed(clean[2]), atol=1e-6, rtol=0)


def _critic(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, mode: str):
    values = values.clone().requires_grad_(True)
    out = value_loss(values, old, returns, mask, clip=0.2)
    loss = aggregate(out.loss_BT, mask, mode, _norm(mask))
    loss.backward()
    return loss.detach(), values.grad, out.clipfrac


@pytest.mark.parametrize("mode", AGG_MODES)
def test_critic_loss_ignores_observation_tokens(mode):
    g = torch.Generator().manual_seed(4)
    values, old, returns = (torch.randn(MASK.shape, generator=g) for _ in range(3))
    clean = _critic(values, old, returns, MASK, mode)
    scrambled = _critic(_scrambled(values, 1), _scrambled(old, 2), _scrambled(returns, 3), MASK, mode)
    packed = _critic(_packed(values), _packed(old), _packed(returns), PACKED_MASK, mode)
    for got, want in zip(scrambled, clean, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(packed[0], clean[0], atol=1e-6, rtol=0)
    torch.testing.assert_close(packed[1], _packed(clean[1]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_mismatch_correction_reads_model_tokens_only(level, mode):
    inputs = _inputs(5)
    cfg = CorrectionConfig(level=level, mode=mode, threshold=1.5, veto_threshold=0.2)
    clean = correction_weights(inputs["prox"], inputs["behav"], MASK, cfg)
    scrambled = correction_weights(_scrambled(inputs["prox"], 1), _scrambled(inputs["behav"], 2), MASK, cfg)
    packed = correction_weights(_packed(inputs["prox"]), _packed(inputs["behav"]), PACKED_MASK, cfg)
    torch.testing.assert_close(scrambled.weight_BT, clean.weight_BT, atol=1e-6, rtol=0)
    torch.testing.assert_close(scrambled.keep_BT, clean.keep_BT)
    assert scrambled.metrics == pytest.approx(clean.metrics, abs=1e-6)
    torch.testing.assert_close(packed.weight_BT, _packed(clean.weight_BT), atol=1e-6, rtol=0)
    assert packed.metrics == pytest.approx(clean.metrics, abs=1e-6)


# Estimators, on TrainSamples as the trainer builds them -----------------------------------


def _episode_samples(rewards_seed: int | None = None) -> list[TrainSample]:
    """Four samples in two groups, with MASK's loss masks; per-turn rewards on turn ends."""
    g = torch.Generator().manual_seed(9)
    samples = []
    for b in range(MASK.shape[0]):
        mask = [int(m) for m in MASK[b]]
        n = max(i for i, m in enumerate(mask) if m) + 1  # the trailing zeros are padding
        rewards = [0.0] * n
        rewards[n - 1] = float(b % 3) - 0.5
        rewards[1] = 0.25 * b  # turn 1 of the episodes ends at 2 or 3; position 1 is a model token
        behav = [-float(torch.rand(1, generator=g)) if m else 0.0 for m in mask[:n]]
        samples.append(
            TrainSample(
                b // 2, [3, 4], [10 + b + t for t in range(n)], behav, rewards, sum(rewards), 0, False, mask[:n]
            )
        )
    if rewards_seed is not None:
        noise = torch.Generator().manual_seed(rewards_seed)
        for x in samples:
            for t, m in enumerate(x.loss_mask):
                if not m:
                    x.token_rewards[t] = float(torch.randn(1, generator=noise)) * 5
                    x.behav_logp[t] = -float(torch.rand(1, generator=noise)) * 9
    return samples


def _packed_samples(samples: list[TrainSample]) -> list[TrainSample]:
    out = []
    for x in samples:
        keep = [t for t, m in enumerate(x.loss_mask) if m]
        out.append(
            TrainSample(
                x.group,
                x.prompt_ids,
                [x.response_ids[t] for t in keep],
                [x.behav_logp[t] for t in keep],
                [x.token_rewards[t] for t in keep],
                x.reward,
                x.min_version,
            )
        )
    return out


def _advantages(samples: list[TrainSample], estimator: str, values: torch.Tensor | None = None):
    full = collate(samples, list(range(len(samples))), pad_id=0)
    extras = {} if values is None else {"values": values[:, : full.mask_BT.shape[1]]}
    settings = TrainerSettings(adv_estimator=estimator, gamma=0.9, lam=0.8)
    adv, returns, _ = compute_advantages(full, samples, extras, settings)
    return full.mask_BT, adv, returns


VALUES = torch.randn(MASK.shape, generator=torch.Generator().manual_seed(12))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "gae"])
def test_estimators_ignore_rewards_and_values_on_observation_tokens(estimator):
    values = VALUES if estimator == "gae" else None
    mask, adv, returns = _advantages(_episode_samples(), estimator, values)
    torch.testing.assert_close(mask, MASK)
    s_values = _scrambled(VALUES, 7) if estimator == "gae" else None
    _, s_adv, s_returns = _advantages(_episode_samples(rewards_seed=8), estimator, s_values)
    torch.testing.assert_close(s_adv * mask, adv * mask, atol=1e-6, rtol=0)
    assert torch.all(adv[mask == 0] == 0)
    if estimator == "gae":
        torch.testing.assert_close(s_returns * mask, returns * mask, atol=1e-6, rtol=0)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "gae"])
def test_estimators_equal_the_model_tokens_alone_packed_together(estimator):
    # For GAE this is verl's rule itself: skipping observation positions is removing them.
    values = VALUES if estimator == "gae" else None
    _, adv, returns = _advantages(_episode_samples(), estimator, values)
    packed_values = _packed(VALUES) if estimator == "gae" else None
    p_mask, p_adv, p_returns = _advantages(_packed_samples(_episode_samples()), estimator, packed_values)
    torch.testing.assert_close(p_mask, PACKED_MASK[:, : p_mask.shape[1]])
    torch.testing.assert_close(_packed(adv)[:, : p_adv.shape[1]], p_adv, atol=1e-6, rtol=0)
    if estimator == "gae":
        torch.testing.assert_close(_packed(returns)[:, : p_returns.shape[1]], p_returns, atol=1e-6, rtol=0)


# verl's recurrences, written out plainly ---------------------------------------------------


def _verl_gae(rewards, values, mask, gamma, lam):
    """verl's ``compute_gae_advantage_return`` loop, one row at a time in plain floats: walking
    back, a position outside the mask leaves next-value and last-advantage as they were."""
    advantages = []
    for r_row, v_row, m_row in zip(rewards.tolist(), values.tolist(), mask.tolist(), strict=True):
        next_value, last = 0.0, 0.0
        row = [0.0] * len(r_row)
        for t in reversed(range(len(r_row))):
            delta = r_row[t] + gamma * next_value - v_row[t]
            candidate = delta + gamma * lam * last
            if m_row[t]:
                next_value, last = v_row[t], candidate
            row[t] = last
        advantages.append(row)
    adv = torch.tensor(advantages, dtype=torch.float64)
    return adv, adv + values.double()


def _verl_whiten(x, mask):
    kept = x[mask > 0]
    return (x - kept.mean()) / (kept.var(unbiased=True) + 1e-8).sqrt()


def test_gae_follows_verls_recurrence_over_a_multi_turn_mask():
    g = torch.Generator().manual_seed(21)
    rewards = torch.randn(MASK.shape, generator=g)
    values = torch.randn(MASK.shape, generator=g)
    adv, returns = A.gae(rewards, values, MASK, gamma=0.95, lam=0.9)
    ref_adv, ref_returns = _verl_gae(rewards, values, MASK, 0.95, 0.9)
    inside = MASK > 0
    torch.testing.assert_close(returns[inside].double(), ref_returns[inside], atol=1e-5, rtol=0)
    torch.testing.assert_close(adv[inside].double(), _verl_whiten(ref_adv, MASK)[inside], atol=1e-5, rtol=0)


# Turn 1 = positions 0-1, observation 2-3 (its reward and value are noise), turn 2 = position 4.
HAND_MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
HAND_REWARDS = torch.tensor([[0.0, 0.5, 9.0, -9.0, 1.0]])
HAND_VALUES = torch.tensor([[0.2, 0.4, 7.0, -7.0, 0.6]])


@pytest.mark.parametrize(
    ("gamma", "lam", "expected_returns"),
    [
        # γ = λ = 1: A_t = (model rewards from t on) − V_t: A = [1.5 − 0.2, 1.5 − 0.4, ·, ·, 1 − 0.6].
        (1.0, 1.0, [1.5, 1.5, 0.0, 0.0, 1.0]),
        # λ = 0: A_t = r_t + γ V_next − V_t, and turn 1's last token bootstraps from V_4 = 0.6 across
        # the observation: A_1 = 0.5 + 0.5·0.6 − 0.4 = 0.4, A_0 = 0.5·0.4 − 0.2 = 0, A_4 = 0.4.
        (0.5, 0.0, [0.2, 0.8, 0.0, 0.0, 1.0]),
    ],
)
def test_gae_by_hand_across_an_observation(gamma, lam, expected_returns):
    _, returns = A.gae(HAND_REWARDS, HAND_VALUES, HAND_MASK, gamma=gamma, lam=lam)
    torch.testing.assert_close(returns, torch.tensor([expected_returns]), atol=1e-6, rtol=0)


def _verl_reinforce_returns(rewards, mask, gamma):
    """verl's REINFORCE++ loop: the running return restarts after every position outside the mask."""
    out = []
    for r_row, m_row in zip(rewards.tolist(), mask.tolist(), strict=True):
        running, row = 0.0, [0.0] * len(r_row)
        for t in reversed(range(len(r_row))):
            running = r_row[t] + gamma * running
            row[t] = running
            running *= m_row[t]
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


def test_reinforce_plus_plus_follows_verl_over_a_multi_turn_mask():
    rewards = torch.randn(MASK.shape, generator=torch.Generator().manual_seed(22))
    adv = A.reinforce_plus_plus(rewards, MASK, gamma=0.9)
    ref = _verl_reinforce_returns(rewards, MASK, 0.9)
    inside = MASK > 0
    torch.testing.assert_close(
        A.discounted_returns(rewards, MASK, 0.9)[inside].double(), ref[inside], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(adv[inside].double(), _verl_whiten(ref, MASK)[inside], atol=1e-5, rtol=0)
    # By hand: turn 2 holds the final reward 1; turn 1 sees only its own 0.5 (γ = 0.5).
    hand = A.discounted_returns(HAND_REWARDS, HAND_MASK, gamma=0.5)
    torch.testing.assert_close(hand, torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]]))


# Whole steps on the tiny model -------------------------------------------------------------


@pytest.mark.parametrize(
    ("estimator", "variant"),
    [("grpo", "decoupled"), ("rloo", "tis"), ("reinforce_plus_plus", "kimi15"), ("gae", "vanilla"), ("grpo", "topr")],
)
def test_a_step_ignores_log_probs_and_rewards_on_observation_tokens(tiny_model_dir, estimator, variant):
    results = []
    for seed in (None, 8):
        models = _models(tiny_model_dir, critic=estimator == "gae")
        settings = TrainerSettings(
            adv_estimator=estimator, pg_variant=variant, ppo_mini_batches=2, micro_batch_tokens=16
        )
        metrics = train_step(models, _episode_samples(rewards_seed=seed), settings, pad_id=0)
        results.append(
            ({k: v for k, v in metrics.items() if not k.startswith(("timing/", "timing_s/"))}, _params(models.actor))
        )
    (clean, clean_params), (scrambled, scrambled_params) = results
    assert clean["actor/grad_norm"] > 0
    assert scrambled == pytest.approx(clean, abs=1e-6)
    torch.testing.assert_close(scrambled_params, clean_params, atol=1e-6, rtol=0)


def test_proximal_log_probs_keep_their_positions_in_an_episode(tiny_model_dir):
    # "always" gathers the proximal log-probs from a separate forward, row by row; a row that
    # lost its positions around an observation would give a different loss than "auto".
    results = {}
    for mode in ("auto", "always"):
        models = _models(tiny_model_dir)
        settings = TrainerSettings(pg_variant="decoupled", recompute_old_log_prob=mode, micro_batch_tokens=16)
        metrics = train_step(models, _episode_samples(), settings, pad_id=0)
        results[mode] = (metrics["actor/pg_loss"], _params(models.actor))
    assert results["auto"][0] == pytest.approx(results["always"][0], abs=1e-7)
    torch.testing.assert_close(results["auto"][1], results["always"][1], atol=1e-7, rtol=0)


def test_a_single_turn_sample_trains_the_same_with_an_all_ones_mask(tiny_model_dir):
    params = []
    for explicit in (False, True):
        samples = [x for x in _packed_samples(_episode_samples())]
        if explicit:
            for x in samples:
                x.loss_mask = [1] * len(x.response_ids)
        models = _models(tiny_model_dir)
        train_step(models, samples, TrainerSettings(), pad_id=0)
        params.append(_params(models.actor))
    assert torch.equal(params[0], params[1])


def test_episode_rewards_land_on_their_turns_and_staleness_reads_model_tokens():
    from relayrl.schema import Group, Sample

    episode = Sample(
        prompt_token_ids=[1],
        response_token_ids=[10, 11, 50, 51, 12, 13, 60],
        behavior_logprobs=[-0.5, -0.5, 0.0, 0.0, -0.5, -0.5, 0.0],
        policy_versions=[3, 3, 1, 1, 4, 4, 4],
        reward=1.0,
        token_rewards=[0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0],
        loss_mask=[1, 1, 0, 0, 1, 1, 0],
        turn_ends=[2, 6],
    )
    (x,) = samples_from_groups([Group("g", "p", [episode])])
    # The final reward on the last model token (5), not on the trailing observation (6).
    assert x.token_rewards == [0.0, 0.25, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert x.reward == 1.25 and x.min_version == 3 and x.model_tokens == 4
