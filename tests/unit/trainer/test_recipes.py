"""ROLL's topr / kimi15 losses and verl's rollout correction against hand-computed values (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.correction import CorrectionConfig, correction_weights
from services.trainer.losses import PolicyLossConfig, policy_loss

D = torch.float64


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=D)


LOGP = [[-1.0, -2.0], [-1.0, -2.0]]
BEHAV = [[-1.5, -1.0], [-1.5, -1.0]]
MASK = [[1.0, 1.0], [1.0, 1.0]]


def test_topr_positive_is_plain_reinforce_and_negative_is_tapered() -> None:
    logp = t(LOGP).requires_grad_()
    adv = t([[0.5, 0.5], [-0.7, -0.7]])
    score = t([[1.0, 1.0], [0.0, 0.0]])  # score 0 counts as negative, as in ROLL (score <= 0)
    cfg = PolicyLossConfig(variant="topr", topr_positive_weight=1.5, topr_negative_weight=2.0)
    out = policy_loss(logp, t(LOGP), t(BEHAV), adv, t(MASK), cfg, score_BT=score)
    r1 = math.exp(-2.0 + 1.0)  # π/π_behav of the second negative token, inside [0, 1]
    want = [
        [-1.5 * 0.5 * -1.0, -1.5 * 0.5 * -2.0],
        # first negative token: ratio e^0.5 > 1 is tapered to 1
        [-2.0 * 1.0 * -0.7 * -1.0, -2.0 * r1 * -0.7 * -2.0],
    ]
    assert torch.allclose(out.loss_BT, t(want), atol=1e-6, rtol=0)
    out.loss_BT.sum().backward()
    # The taper is detached: d loss / d log π = −w·clip(ρ, 0, 1)·A.
    grad = [[-1.5 * 0.5, -1.5 * 0.5], [-2.0 * 1.0 * -0.7, -2.0 * r1 * -0.7]]
    assert torch.allclose(logp.grad, t(grad), atol=1e-6, rtol=0)
    assert out.clipfrac.item() == pytest.approx(0.25)  # one negative token with ρ > 1 of four


def test_topr_ratio_far_from_one_is_bounded_to_zero_one() -> None:
    logp = t([[0.0, -30.0]]).requires_grad_()
    behav = t([[-25.0, 0.0]])
    cfg = PolicyLossConfig(variant="topr")
    out = policy_loss(logp, logp.detach(), behav, t([[-1.0, -1.0]]), t([[1.0, 1.0]]), cfg, score_BT=t([[-1.0, -1.0]]))
    want = [[-1.0 * -1.0 * 0.0, -math.exp(-20.0) * -1.0 * -30.0]]  # e^25 → 1; e^-30 clamped at e^-20
    assert torch.allclose(out.loss_BT, t(want), atol=1e-6, rtol=0)


def test_kimi15_is_reinforce_plus_squared_log_ratio() -> None:
    logp = t(LOGP).requires_grad_()
    adv = t([[0.5, 0.5], [-0.7, -0.7]])
    cfg = PolicyLossConfig(variant="kimi15", kimi15_tau=0.3)
    out = policy_loss(logp, t(LOGP), t(BEHAV), adv, t(MASK), cfg)
    want = [
        [-0.5 * -1.0 + 0.15 * 0.25, -0.5 * -2.0 + 0.15 * 1.0],
        [0.7 * -1.0 + 0.15 * 0.25, 0.7 * -2.0 + 0.15 * 1.0],
    ]
    assert torch.allclose(out.loss_BT, t(want), atol=1e-6, rtol=0)
    out.loss_BT.sum().backward()
    grad = [[-0.5 + 0.3 * 0.5, -0.5 + 0.3 * -1.0], [0.7 + 0.3 * 0.5, 0.7 + 0.3 * -1.0]]
    assert torch.allclose(logp.grad, t(grad), atol=1e-6, rtol=0)


def test_topr_without_scores_fails_clearly() -> None:
    with pytest.raises(ValueError, match="scores"):
        policy_loss(t(LOGP), t(LOGP), t(BEHAV), t(MASK), t(MASK), PolicyLossConfig(variant="topr"))


# prox − behav per token: 0.5, −1, 1 and a padded position that must not count.
PROX = [[-0.5, -2.0, -1.0, 9.0]]
BEH = [[-1.0, -1.0, -2.0, 0.0]]
CMASK = [[1.0, 1.0, 1.0, 0.0]]


def weights(**kw: object) -> tuple[list[float], dict[str, float]]:
    out = correction_weights(t(PROX), t(BEH), t(CMASK), CorrectionConfig(**kw))  # type: ignore[arg-type]
    return out.weight_BT[0].tolist(), out.metrics


def test_token_truncate_caps_above_only() -> None:
    w, m = weights(level="token", mode="truncate", threshold=2.0)
    assert w == pytest.approx([math.exp(0.5), math.exp(-1.0), 2.0, 0.0], abs=1e-6)
    assert m["mismatch/masked_frac"] == 0.0
    assert m["mismatch/kl"] == pytest.approx(-(0.5 - 1.0 + 1.0) / 3, abs=1e-6)
    k3 = sum(math.exp(x) - x - 1 for x in (0.5, -1.0, 1.0)) / 3
    assert m["mismatch/k3_kl"] == pytest.approx(k3, abs=1e-6)
    assert m["mismatch/ratio_q50"] == pytest.approx(math.exp(0.5), abs=1e-6)


def test_token_mask_is_icepop() -> None:
    w, m = weights(level="token", mode="mask", threshold=2.0, threshold_lower=0.5)
    assert w == pytest.approx([math.exp(0.5), 0.0, 0.0, 0.0], abs=1e-6)
    assert m["mismatch/masked_frac"] == pytest.approx(2 / 3, abs=1e-6)


def test_mask_lower_defaults_to_reciprocal() -> None:
    w, _ = weights(level="token", mode="mask", threshold=3.0)
    assert w == pytest.approx([math.exp(0.5), math.exp(-1.0), math.exp(1.0), 0.0], abs=1e-6)
    w, _ = weights(level="token", mode="mask", threshold=2.5)  # lower 0.4 > e^-1
    assert w == pytest.approx([math.exp(0.5), 0.0, 0.0, 0.0], abs=1e-6)


def test_sequence_and_geometric_levels() -> None:
    w, _ = weights(level="sequence", mode="truncate", threshold=10.0)
    assert w == pytest.approx([math.exp(0.5)] * 3 + [0.0], abs=1e-6)
    w, _ = weights(level="geometric", mode="truncate", threshold=10.0)
    assert w == pytest.approx([math.exp(0.5 / 3)] * 3 + [0.0], abs=1e-6)
    w, m = weights(level="sequence", mode="mask", threshold=1.5)
    assert w == [0.0, 0.0, 0.0, 0.0]
    assert m["mismatch/masked_frac"] == 1.0


def test_veto_zeroes_the_whole_sequence() -> None:
    w, m = weights(level="token", mode="truncate", threshold=2.0, veto_threshold=0.4)
    assert w == [0.0, 0.0, 0.0, 0.0]
    assert m["mismatch/masked_frac"] == 1.0


def test_correction_replaces_the_decoupled_weight() -> None:
    logp = t([[-1.0]])
    prox = t([[-1.0]])
    behav = t([[-3.0]])  # π_prox/π_behav = e² > is_cap
    adv = t([[1.0]])
    corr = t([[0.25]])
    cfg = PolicyLossConfig(variant="decoupled", is_cap=2.0)
    plain = policy_loss(logp, prox, behav, adv, t([[1.0]]), cfg)
    corrected = policy_loss(logp, prox, behav, adv, t([[1.0]]), cfg, correction_BT=corr)
    assert plain.loss_BT.item() == pytest.approx(-2.0, abs=1e-6)
    assert corrected.loss_BT.item() == pytest.approx(-0.25, abs=1e-6)
    with pytest.raises(ValueError, match="rollout_is"):
        policy_loss(logp, prox, behav, adv, t([[1.0]]), PolicyLossConfig(variant="tis"), correction_BT=corr)
