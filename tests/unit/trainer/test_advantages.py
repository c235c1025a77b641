"""Every advantage estimator against numbers worked out by hand."""

import math

import pytest
import torch

from services.trainer import advantages as A

ONES = torch.ones(4, 2)


def test_grpo_normalises_within_each_group():
    adv = A.grpo(torch.tensor([1.0, 0.0, 0.5, 0.5]), ONES, [0, 0, 1, 1])
    # group 0: mean 0.5, unbiased std sqrt(0.5) → ±0.5/0.7071; group 1 has no spread → 0
    expected = torch.tensor([1 / math.sqrt(2), -1 / math.sqrt(2), 0.0, 0.0])[:, None].expand(4, 2)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_grpo_without_std_only_centres():
    adv = A.grpo(torch.tensor([1.0, 0.0, 0.5, 0.5]), ONES, [0, 0, 1, 1], norm_by_std=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, 0.0, 0.0]))


def test_grpo_masks_padding_and_lone_samples_get_zero():
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    adv = A.grpo(torch.tensor([1.0, 0.0, 7.0]), mask, [0, 0, 1])
    assert adv[0, 1] == 0 and adv[0, 0] > 0
    assert torch.all(adv[2] == 0)


def test_rloo_subtracts_the_mean_of_the_others():
    adv = A.rloo(torch.tensor([3.0, 0.0, 0.0]), torch.ones(3, 1), [0, 0, 0])
    torch.testing.assert_close(adv[:, 0], torch.tensor([3.0, -1.5, -1.5]))


def test_discounted_returns_ignore_padding():
    returns = A.discounted_returns(torch.tensor([[0.0, 1.0, 5.0]]), torch.tensor([[1.0, 1.0, 0.0]]), gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.5, 1.0, 0.0]]))


def test_reinforce_plus_plus_whitens_returns_over_the_batch():
    adv = A.reinforce_plus_plus(torch.tensor([[1.0], [3.0]]), torch.ones(2, 1), gamma=1.0)
    # mean 2, unbiased variance 2
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2)]), atol=1e-5, rtol=0)


def test_gae_matches_the_recursion():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.8, 9.0]])  # the padded value must not leak in
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv, returns = A.gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # δ1 = 1 − 0.8 = 0.2 → A1 = 0.2;  δ0 = 0.9·0.8 − 0.5 = 0.22 → A0 = 0.22 + 0.45·0.2 = 0.31
    torch.testing.assert_close(returns, torch.tensor([[0.31 + 0.5, 0.2 + 0.8, 0.0]]))
    assert adv[0, 0] > 0 > adv[0, 1] and adv[0, 2] == 0  # whitened: the larger advantage is positive


@pytest.mark.parametrize("fn", [A.masked_mean, A.masked_whiten])
def test_empty_mask_gives_zero_not_nan(fn):
    out = fn(torch.ones(2, 3), torch.zeros(2, 3))
    assert torch.all(out == 0)
