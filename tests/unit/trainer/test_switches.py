"""verl's switches, each with the effect users expect: enable_gradient_checkpointing runs each
decoder block's forward again in the backward and changes no gradient; ppo_max_token_len_per_gpu
bounds every micro-batch's tokens (tests/unit/trainer/test_packing.py); use_torch_compile is
checked on a GPU (tests/gpu/test_trainer_gpu.py: compiling on a CPU takes minutes)."""

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.step import train_step
from services.trainer.trainer import build_models
from tests.unit.trainer.test_packing import _samples


def test_gradient_checkpointing_recomputes_each_block_and_keeps_the_gradients(tiny_model_dir):
    results = {}
    for on in (False, True):
        settings = TrainerSettings(model_dir=tiny_model_dir, enable_gradient_checkpointing=on, lr=1e-3)
        models = build_models(settings, D.local_context(), fsdp=False)
        calls = [0]
        # A module inside the block (transformers may checkpoint the block's forward without its hooks),
        # counted as it starts: the recomputation stops once it has what the backward needs.
        models.actor.model.layers[0].mlp.register_forward_pre_hook(lambda *_, c=calls: c.__setitem__(0, c[0] + 1))
        grads: list[torch.Tensor] = []
        models.actor_opt.register_step_pre_hook(
            lambda *_, m=models, grads=grads: grads.append(torch.cat([p.grad.flatten() for p in m.actor.parameters()]))
        )
        metrics = train_step(models, _samples(), settings, pad_id=0)
        results[on] = (calls[0], grads[0], metrics["actor/pg_loss"])
    (plain_calls, plain_grad, plain_loss), (ckpt_calls, ckpt_grad, ckpt_loss) = results[False], results[True]
    assert ckpt_calls == 2 * plain_calls > 0  # every micro-batch's forward ran again in its backward
    assert ckpt_loss == plain_loss
    torch.testing.assert_close(ckpt_grad, plain_grad, atol=1e-6, rtol=0)
