"""verl's switches, each with the effect users expect: enable_gradient_checkpointing runs each
decoder block's forward again in the backward and changes no gradient; ppo_max_token_len_per_gpu
bounds every micro-batch's tokens (tests/unit/trainer/test_packing.py); use_torch_compile is
checked on a GPU (tests/gpu/test_trainer_gpu.py: compiling on a CPU takes minutes)."""

import torch

from services.trainer import distributed as D
from services.trainer.config import TrainerSettings
from services.trainer.step import train_step, warm_up
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


def _state(models) -> dict[str, torch.Tensor]:
    named = {f"actor.{n}": p.detach().clone() for n, p in models.actor.named_parameters()}
    named |= {f"critic.{n}": p.detach().clone() for n, p in models.critic.named_parameters()}
    return named


def test_the_start_up_warm_up_runs_every_pass_of_a_step_and_leaves_weights_optimizer_and_randomness_as_they_were(
    tiny_model_dir, monkeypatch
):
    # A critic and a reference too (GAE, KL loss): every model a step runs. The passes are eager here
    # (compiling on a CPU takes minutes); on a GPU they build the graphs (tests/gpu/trainer).
    settings = TrainerSettings(model_dir=tiny_model_dir, adv_estimator="gae", use_kl_loss=True, lr=1e-3)
    monkeypatch.setattr("services.trainer.step.compiles", lambda s: True)
    warmed = build_models(settings, D.local_context(), fsdp=False)
    plain = build_models(settings, D.local_context(), fsdp=False)
    calls = {"actor": 0, "critic": 0, "ref": 0}
    for name in calls:
        model = getattr(warmed, name)
        model.register_forward_pre_hook(lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
    before, rng = _state(warmed), torch.get_rng_state()

    assert warm_up(warmed, settings, pad_id=0)

    assert calls["actor"] >= 2 and calls["critic"] >= 2 and calls["ref"] >= 1  # no-grad passes and the update's
    after = _state(warmed)
    assert all(torch.equal(after[n], t) for n, t in before.items())
    assert all(p.grad is None for p in [*warmed.actor.parameters(), *warmed.critic.parameters()])
    assert not warmed.actor_opt.state and not warmed.critic_opt.state
    assert torch.equal(torch.get_rng_state(), rng)
    # The first step after it is the step a trainer without it takes.
    got, want = train_step(warmed, _samples(), settings, 0), train_step(plain, _samples(), settings, 0)
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert got[key] == want[key], key
