"""Log-probs and entropy from hidden states and the output head, a chunk of tokens at a time: the
values and gradients of the whole [tokens, vocabulary] logits, in fp32, without ever holding them."""

import torch

from services.trainer.model import token_logprobs


def _whole(head, hidden, targets, temperature):
    logp_all = torch.log_softmax(head(hidden).float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def test_chunked_log_probs_and_entropy_have_the_values_and_gradients_of_the_whole_logits():
    torch.manual_seed(0)
    tokens, width, vocab = 37, 16, 300
    head = torch.nn.Linear(width, vocab, bias=False)
    hidden = torch.randn(tokens, width, requires_grad=True)
    targets = torch.randint(0, vocab, (tokens,))
    weights = torch.randn(tokens)  # a loss that weighs each token's log-prob and entropy differently

    results = []
    for chunk in (None, 5):
        head.zero_grad()
        hidden.grad = None
        if chunk is None:
            logp, entropy = _whole(head, hidden, targets, 0.7)
        else:
            logp, entropy = token_logprobs(head, hidden, targets, 0.7, with_entropy=True, chunk_tokens=chunk)
        (weights * logp - 0.1 * weights.flip(0) * entropy).sum().backward()
        results.append((logp.detach(), entropy.detach(), hidden.grad.clone(), head.weight.grad.clone()))
    whole, chunked = results
    for a, b in zip(whole, chunked, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert whole[3].abs().sum() > 0  # the gradients are real


def test_without_gradients_nothing_is_kept_for_a_backward():
    head = torch.nn.Linear(8, 50, bias=False)
    hidden, targets = torch.randn(9, 8), torch.randint(0, 50, (9,))
    with torch.no_grad():
        logp, entropy = token_logprobs(head, hidden, targets, 1.0, with_entropy=False, chunk_tokens=4)
    assert entropy is None and not logp.requires_grad
    torch.testing.assert_close(logp, _whole(head, hidden, targets, 1.0)[0], atol=1e-5, rtol=0)


def test_fused_statistics_have_the_values_and_gradients_of_eager_ones_with_one_graph_for_every_chunk_length():
    """The compiled statistics (the default on CUDA), here compiled for the CPU: the same log-probs,
    entropies and gradients as eager torch within fp32 rounding, through the chunks' checkpoints, and
    the chunks of every length (16, then the shorter last ones) run one graph with gradients and one
    without, compiled once."""
    from torch._dynamo.utils import counters

    torch.manual_seed(1)
    width, vocab = 16, 300
    head = torch.nn.Linear(width, vocab, bias=False)
    graphs_before = counters["stats"]["unique_graphs"]
    for tokens in (37, 45, 18):
        hidden = torch.randn(tokens, width, requires_grad=True)
        targets = torch.randint(0, vocab, (tokens,))
        weights = torch.randn(tokens)
        results = []
        for fused in (False, True):
            head.zero_grad()
            hidden.grad = None
            logp, entropy = token_logprobs(head, hidden, targets, 0.7, True, chunk_tokens=16, fused=fused)
            (weights * logp - 0.1 * weights.flip(0) * entropy).sum().backward()
            with torch.no_grad():
                no_grad_logp, _ = token_logprobs(head, hidden, targets, 0.7, False, chunk_tokens=16, fused=fused)
            grads = (hidden.grad.clone(), head.weight.grad.clone())
            results.append((logp.detach(), entropy.detach(), no_grad_logp, *grads))
        for eager_value, fused_value in zip(*results, strict=True):
            torch.testing.assert_close(fused_value, eager_value, atol=1e-5, rtol=1e-5)
    assert counters["stats"]["unique_graphs"] - graphs_before == 2
