import math

import pytest
import torch

from relayrl.models.loading import load_causal_lm, load_tokenizer
from services.trainer.model import AdamW, LrSchedule, build_optimizer
from services.trainer.sft.data import encode_single
from services.trainer.sft.step import collate, micro_loss, train_step


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def model(tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir).train()


@pytest.fixture
def examples(tokenizer):
    # Very different response lengths, so a mean of per-micro-batch means would differ from the token mean.
    return [
        encode_single(tokenizer, "copy 0110", "0110"),
        encode_single(tokenizer, "say a", "a"),
        encode_single(tokenizer, "write it out", "one two three four five six"),
    ]


def hand_loss(model, examples) -> float:
    """Σ −log p(token | tokens before) over trained tokens / their count, one unpadded sequence at a time."""
    total, count = 0.0, 0
    with torch.no_grad():
        for e in examples:
            logits = model(input_ids=torch.tensor([e.input_ids])).logits[0]
            for t in range(1, len(e.input_ids)):
                if e.loss_mask[t]:
                    z = logits[t - 1].double()
                    total += float(torch.logsumexp(z, 0) - z[e.input_ids[t]])
                    count += 1
    return total / count


def test_loss_is_the_token_mean_nll_of_response_tokens_whatever_the_micro_batches(model, examples, tokenizer):
    expected = hand_loss(model, examples)
    trained = sum(e.trained_tokens for e in examples)
    assert trained == 5 + 2 + 28
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        whole = float(micro_loss(model, collate(examples, pad), trained))
        split = sum(float(micro_loss(model, collate([e], pad), trained)) for e in examples)
    assert whole == pytest.approx(expected, rel=1e-5)
    assert split == pytest.approx(expected, rel=1e-5)
    # A random 259-token model starts near uniform: the loss is about log(259).
    assert abs(expected - math.log(259)) < 1.0


def test_a_step_reports_the_loss_before_its_update_and_lowers_it(model, examples, tokenizer):
    before = hand_loss(model, examples)
    opt, sched = build_optimizer(model, AdamW(lr=1e-2), LrSchedule())
    result = train_step(model, opt, sched, examples, micro_batch_size=2, clip_grad=1.0, pad_id=tokenizer.pad_token_id)
    assert result.loss == pytest.approx(before, rel=1e-5)
    assert result.trained_tokens == 35 and result.tokens == sum(len(e.input_ids) for e in examples)
    assert result.stepped and result.grad_norm > 0 and result.lr == pytest.approx(1e-2)
    assert hand_loss(model, examples) < before


def test_only_trained_tokens_meet_the_output_head(model, examples, tokenizer):
    """Prompts and padding get no logits: the head sees one position a row (the model's own
    logits_to_keep) and then exactly the trained tokens, whose loss is unchanged above."""
    from services.trainer.model import output_head

    seen = []
    handle = output_head(model).register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[0]))
    with torch.no_grad():
        micro_loss(model, collate(examples, tokenizer.pad_token_id), 35)
    handle.remove()

    assert seen == [len(examples), 5 + 2 + 28]
