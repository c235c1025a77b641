"""target_entropy: the entropy bonus acts only on micro-batches whose mean token entropy is below the
target, so a policy already that random is not pushed further (Skywork-OR1's target entropy)."""

import pytest
import torch

from services.trainer.batching import TrainSample
from services.trainer.config import TrainerSettings
from services.trainer.model import LrSchedule, build_optimizer, load_actor
from services.trainer.step import Models, train_step

# The untrained tiny model's mean token entropy is about 5.5 nats.
BELOW = 1.0
ABOVE = 10.0


def _samples() -> list[TrainSample]:
    return [
        TrainSample(i // 2, [5, 6, 7], [10 + (i * 7 + t) % 40 for t in range(4)], [-2.0] * 4,
                    [0.0, 0.0, 0.0, float(i % 2)], float(i % 2), 0)
        for i in range(8)
    ]  # fmt: skip


def _step(model_dir, **settings) -> tuple[dict[str, float], torch.Tensor]:
    torch.manual_seed(0)
    actor = load_actor(model_dir, torch.device("cpu"))
    opt, sched = build_optimizer(actor, 1e-3, 0.0, LrSchedule())
    metrics = train_step(Models(actor, opt, sched), _samples(), TrainerSettings(**settings), pad_id=0)
    return metrics, torch.cat([p.detach().flatten() for p in actor.parameters()])


def test_the_bonus_acts_below_the_target_and_not_above_it(tiny_model_dir):
    _, plain = _step(tiny_model_dir)
    _, bonus = _step(tiny_model_dir, entropy_coeff=0.01)
    reached, at_target = _step(tiny_model_dir, entropy_coeff=0.01, target_entropy=BELOW)
    below, under_target = _step(tiny_model_dir, entropy_coeff=0.01, target_entropy=ABOVE)
    assert reached["actor/entropy"] > BELOW and reached["actor/entropy_bonus_on"] == 0.0
    assert torch.equal(at_target, plain)  # a policy past the target is not pushed further
    assert below["actor/entropy_bonus_on"] == 1.0
    assert torch.equal(under_target, bonus) and not torch.equal(bonus, plain)


def test_a_target_must_be_positive():
    with pytest.raises(ValueError, match="target_entropy"):
        TrainerSettings(target_entropy=0)
