"""Policy, value and KL losses and their aggregation against numbers worked out by hand."""

import math

import pytest
import torch

from services.trainer.losses import (
    Normaliser,
    PolicyLossConfig,
    aggregate,
    explained_variance,
    kl_estimate,
    policy_loss,
    value_loss,
)

CFG = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, is_cap=2.0)
LN = math.log


def _ppo_case():
    # tokens: ratio 1.5 with A=1 (clipped at 1.2), ratio 5 with A=−1 (dual clip at 3),
    # ratio 0.5 with A=−1 (clipped at 0.8), ratio 1 with A=2 (inside the trust region)
    old = torch.zeros(1, 4)
    logp = torch.tensor([[LN(1.5), LN(5.0), LN(0.5), 0.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 2.0]])
    return logp, old, adv


def test_vanilla_ppo_clip_and_dual_clip():
    logp, old, adv = _ppo_case()
    out = policy_loss(logp, old, old, adv, torch.ones(1, 4), CFG)
    torch.testing.assert_close(out.loss_BT, torch.tensor([[-1.2, 3.0, 0.8, -2.0]]))
    assert out.clipfrac == pytest.approx(0.5)
    assert out.clipfrac_lower == pytest.approx(0.25)


def test_masked_tokens_do_not_count_in_clip_fractions():
    logp, old, adv = _ppo_case()
    out = policy_loss(logp, old, old, adv, torch.tensor([[1.0, 1.0, 1.0, 0.0]]), CFG)
    assert out.clipfrac == pytest.approx(2 / 3)
    assert out.clipfrac_lower == pytest.approx(1 / 3)


def test_decoupled_weights_by_truncated_behaviour_to_proximal_ratio():
    logp, prox, adv = _ppo_case()
    behav = torch.tensor([[-LN(3.0), -LN(0.5), 0.0, 0.0]])  # π_prox/π_behav = 3 (→ cap 2), 0.5, 1, 1
    cfg = PolicyLossConfig(variant="decoupled", is_cap=2.0)
    out = policy_loss(logp, prox, behav, adv, torch.ones(1, 4), cfg)
    torch.testing.assert_close(out.loss_BT, torch.tensor([[-1.2 * 2, 3.0 * 0.5, 0.8, -2.0]]))


def test_tis_gradient_is_truncated_weight_times_advantage():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    behav = torch.tensor([[-1.0 - LN(3.0), -1.0 - LN(0.5)]])  # π/π_behav = 3 (→ 2), 0.5
    out = policy_loss(logp, logp.detach(), behav, torch.ones(1, 2), torch.ones(1, 2), PolicyLossConfig(variant="tis"))
    out.loss_BT.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, -0.5]]))
    assert out.clipfrac == pytest.approx(0.5)


def test_cispo_clips_the_weight_but_keeps_every_gradient():
    logp = torch.tensor([[-1.0, -1.0, -1.0]], requires_grad=True)
    behav = torch.tensor([[-1.0 - LN(3.0), -1.0 - LN(0.5), -1.0]])
    cfg = PolicyLossConfig(variant="cispo", cispo_eps_low=0.2, cispo_eps_high=0.28)
    out = policy_loss(logp, logp.detach(), behav, torch.ones(1, 3), torch.ones(1, 3), cfg)
    out.loss_BT.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28, -0.8, -1.0]]))
    assert out.clipfrac == pytest.approx(2 / 3)


def test_kl_estimators():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    with pytest.raises(ValueError, match="k4"):
        kl_estimate(logp, ref, "k4")


def test_value_loss_clips_around_old_values():
    out = value_loss(
        torch.tensor([[1.0, 1.0]]), torch.tensor([[0.0, 0.8]]), torch.tensor([[2.0, 0.0]]), torch.ones(1, 2), 0.5
    )
    # token 0: clipped V = 0.5 → max(1, 2.25)/2; token 1: within the clip → 1/2
    torch.testing.assert_close(out.loss_BT, torch.tensor([[1.125, 0.5]]))
    assert out.clipfrac == pytest.approx(0.5)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0]])
    assert explained_variance(returns, returns, torch.ones(1, 3)).item() == pytest.approx(1.0)
    assert explained_variance(returns, torch.ones(1, 3), torch.ones(1, 3)).item() == 0.0


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"), [("token-mean", 10 / 4), ("seq-mean-token-sum", 10 / 2), ("seq-mean-token-mean", 6 / 2)]
)
def test_aggregation_modes(mode, expected):
    assert aggregate(LOSS, MASK, mode, Normaliser(tokens=4, sequences=2)).item() == pytest.approx(expected)


def test_micro_batch_shares_add_up_to_the_batch_loss():
    norm = Normaliser(tokens=4, sequences=2)
    parts = sum(aggregate(LOSS[i : i + 1], MASK[i : i + 1], "token-mean", norm) for i in range(2))
    assert parts.item() == pytest.approx(aggregate(LOSS, MASK, "token-mean", norm).item())


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_empty_mask_aggregates_to_zero_even_over_non_finite_padding(mode):
    out = aggregate(torch.full((2, 3), float("inf")), torch.zeros(2, 3), mode, Normaliser(0, 0))
    assert out.item() == 0.0
