"""Packed micro-batches (verl's use_remove_padding, the default with CUDA): each micro-batch's sequences in
one row with positions restarting at each, attention confined to each sequence by transformers'
document mask. A packed step is the padded step, loss and gradients, in fp32."""

import pytest
import torch

from services.trainer.batching import TrainSample, collate, collate_packed, dummy_micro_batch, pack_tokens
from services.trainer.config import TrainerSettings
from services.trainer.model import (
    AdamW,
    LrSchedule,
    build_optimizer,
    load_actor,
    load_critic,
    output_head,
    policy_forward,
)
from services.trainer.step import Models, plan_mini_batch, train_step

# A long-tailed mix of response lengths, and prompts of several lengths.
LENGTHS = [2, 3, 3, 4, 5, 6, 9, 12, 15, 30]


def _samples(lengths=LENGTHS):
    return [
        TrainSample(
            i // 2,
            [5, 6, 7, 8][: 1 + i % 4],
            [10 + (i * 7 + t) % 40 for t in range(n)],
            [-2.0] * n,
            [0.0] * (n - 1) + [float(i % 3 == 0)],
            float(i % 3 == 0),
            0,
        )
        for i, n in enumerate(lengths)
    ]


def _models(model_dir, critic=False):
    torch.manual_seed(0)
    actor = load_actor(model_dir, torch.device("cpu"))
    opt, sched = build_optimizer(actor, AdamW(1e-3), LrSchedule())
    # AdamW's first step moves a weight by lr·g/(|g| + eps), steepest (lr/eps) where g is near 0:
    # at torch's eps = 1e-8 the fp32 rounding of a gradient of 3e-8 (the two layouts sum in different
    # orders) moved its weight by 1.04e-5. At 1e-5 (PPO's usual Adam eps: OpenAI baselines, CleanRL)
    # gradients that agree within 3e-8, as these do, move weights alike within 3e-6.
    for group in opt.param_groups:
        group["eps"] = 1e-5
    models = Models(actor, opt, sched)
    if critic:
        models.critic = load_critic(model_dir, torch.device("cpu"), 0)
        models.critic_opt, models.critic_sched = build_optimizer(models.critic, AdamW(1e-3), LrSchedule())
    return models


def test_a_packed_row_holds_every_sequence_once_with_positions_restarting():
    samples = _samples([3, 1, 2])
    mb = collate_packed(samples, [0, 1, 2])
    assert mb.input_ids_BL.shape == (1, sum(s.length for s in samples))
    assert mb.input_ids_BL[0].tolist() == [t for s in samples for t in s.prompt_ids + s.response_ids]
    assert mb.position_ids_BL[0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4]
    assert mb.response_start_B.tolist() == [1, 6, 10]  # each response's first token, in the row
    assert "attention_mask" not in mb.model_inputs(torch.device("cpu"))


def test_a_packed_forward_gives_each_sequence_its_own_log_probs(tiny_model_dir):
    model = load_actor(tiny_model_dir, torch.device("cpu"))
    samples = _samples()
    index = list(range(len(samples)))
    with torch.no_grad():
        padded = policy_forward(model, collate(samples, index, pad_id=0), 1.0, True)
        packed = policy_forward(model, collate_packed(samples, index), 1.0, True)
        alone = policy_forward(model, collate_packed(samples, [9]), 1.0, True)
    mask = collate(samples, index, pad_id=0).mask_BT > 0
    torch.testing.assert_close(packed.logp_BT[mask], padded.logp_BT[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.entropy_BT[mask], padded.entropy_BT[mask], atol=1e-5, rtol=0)
    # The last sequence sees none of the nine packed before it.
    n = len(samples[9].response_ids)
    torch.testing.assert_close(packed.logp_BT[9, :n], alone.logp_BT[0, :n], atol=1e-5, rtol=0)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_only_response_tokens_meet_the_output_head(tiny_model_dir, layout):
    """The [B, T] rectangle spans the longest response (30 tokens for ten of 2 to 30 here): its padding
    is neither sent through the output head nor given a log-prob, and every response token gets the
    log-prob and entropy of the whole logits at its position."""
    model = load_actor(tiny_model_dir, torch.device("cpu"))
    samples = _samples()
    index = list(range(len(samples)))
    mb = collate(samples, index, pad_id=0) if layout == "padded" else collate_packed(samples, index)
    seen = []
    handle = output_head(model).register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    with torch.no_grad():
        out = policy_forward(model, mb, 0.7, True)
        handle.remove()
        logits_RLV = model(**mb.model_inputs(torch.device("cpu")), use_cache=False).logits

    # The model's own forward keeps one position a row (logits_to_keep); then the response tokens.
    assert seen == [mb.input_ids_BL.shape[0], sum(LENGTHS)] and sum(LENGTHS) < len(LENGTHS) * max(LENGTHS)
    for b, sample in enumerate(samples):
        n, start, row = len(sample.response_ids), int(mb.response_start_B[b]), int(mb.rows()[b])
        logp_TV = torch.log_softmax(logits_RLV[row, start - 1 : start - 1 + n] / 0.7, dim=-1)
        expected = logp_TV.gather(-1, torch.tensor(sample.response_ids)[:, None])[:, 0]
        torch.testing.assert_close(out.logp_BT[b, :n], expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy_BT[b, :n], -(logp_TV.exp() * logp_TV).sum(-1), atol=1e-5, rtol=0)
        assert not out.logp_BT[b, n:].any() and not out.entropy_BT[b, n:].any()


def test_a_micro_batch_without_response_tokens_still_runs_the_output_head(tiny_model_dir):
    """FSDP reduces every rank's gradients together: the dummy micro-batch a rank with fewer runs
    must send its one position through the head too, for a loss of exactly zero."""
    model = load_actor(tiny_model_dir, torch.device("cpu"))
    seen = []
    handle = output_head(model).register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    out = policy_forward(model, dummy_micro_batch(pad_id=0), 1.0, True)
    handle.remove()
    (out.logp_BT * 0.0).sum().backward()

    assert seen == [1, 1] and output_head(model).weight.grad is not None


@pytest.fixture
def one_torch_thread():
    """The padded layout's matmuls round differently with the number of intra-op threads (the
    packed one does not), and a test worker's count is whatever the modules it imported set (the
    engine tests set 1): one thread here, as in every worker of a full run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize(("estimator", "variant"), [("grpo", "decoupled"), ("gae", "vanilla")])
def test_packed_and_padded_steps_give_the_same_loss_and_gradients(tiny_model_dir, estimator, variant):
    results = {}
    for packed in (True, False):
        models = _models(tiny_model_dir, critic=estimator == "gae")
        grads: list[torch.Tensor] = []
        models.actor_opt.register_step_pre_hook(
            lambda *_, m=models, grads=grads: grads.append(torch.cat([p.grad.flatten() for p in m.actor.parameters()]))
        )
        settings = TrainerSettings(
            adv_estimator=estimator,
            pg_variant=variant,
            use_remove_padding=packed,
            ppo_max_token_len_per_gpu=48,
            entropy_coeff=0.01,
            recompute_old_log_prob="always",
        )
        metrics = train_step(models, _samples(), settings, pad_id=0)
        results[packed] = (metrics, grads[0], torch.cat([p.detach().flatten() for p in models.actor.parameters()]))
    packed, padded = results[True], results[False]
    assert packed[0]["perf/padding_ratio"] == 0.0 < padded[0]["perf/padding_ratio"]
    keys = ["actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm"]
    keys += ["critic/vf_loss", "critic/grad_norm"] if estimator == "gae" else []
    for key in keys:
        assert packed[0][key] == pytest.approx(padded[0][key], abs=1e-5), key
    assert packed[0]["actor/grad_norm"] > 0
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[2], padded[2], atol=1e-5, rtol=0)


def test_the_token_budget_counts_real_tokens_when_packed():
    samples = _samples()
    index = list(range(len(samples)))
    lengths = [s.length for s in samples]
    for budget in (16, 48, 400):
        settings = TrainerSettings(ppo_max_token_len_per_gpu=budget, use_remove_padding=True)
        plan = plan_mini_batch(samples, index, settings, pad_id=0)
        rows = [mb.input_ids_BL.shape[1] for mb in plan.micro]
        assert sum(rows) == sum(lengths)  # every token once, none padding
        assert all(n <= budget or len(mb.index) == 1 for n, mb in zip(rows, plan.micro, strict=True))
    assert len(pack_tokens(lengths, 400)) == 1
    assert len(pack_tokens(lengths, 48)) < len(pack_tokens(lengths, 16))
