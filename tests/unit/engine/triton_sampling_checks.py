"""The triton sampler's checks, run by ``test_triton_sampling.py`` in a process of their own: with
``TRITON_INTERPRET=1`` set before Triton is imported, the kernel runs in Triton's interpreter
against the torch sampler; with ``compile`` as argument (and no interpreter), it is compiled for a
Hopper GPU (sm_90, the H100's and H200's) without one, which catches what the interpreter lets
through (a loop-carried value changing type, an operation Triton cannot lower). Prints one line per
check that passed."""

from __future__ import annotations

import os
import sys

import torch

from services.engine import sampling
from services.engine.sampling import SamplingConfig

CHECKS = [
    "log-probs are the torch sampler's, greedy rows take the argmax",
    "the argmax is found past the first tile, the first of equal logits wins",
    "draws follow softmax(logits / temperature)",
    "one seed repeats its draws, and the generator moves on",
    "a top-p or top-k row sends the batch to the torch sampler",
]
COMPILED = ["compiles for sm_90 with bfloat16 and float32 logits"]

# Chi-square's 0.999 quantile at 5 degrees of freedom: six-token draws beyond it are not softmax's.
CHI2_5_999 = 20.52


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * len(tokens)
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    return float(((counts - expected) ** 2 / expected).sum())


def interpreted() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    from services.engine import triton_sampling  # imports Triton, which reads TRITON_INTERPRET then
    from services.engine.sampling import sampler_named

    torch.set_num_threads(1)
    sample = sampler_named("triton", torch.device("cpu")).sample
    generator = torch.Generator().manual_seed(3)
    configs = [SamplingConfig(temperature=t) for t in (1.0, 0.7, 0.0, 1.3, 0.0)]
    temperature_B1 = torch.tensor([[c.temperature if not c.greedy else 1.0] for c in configs])
    for dtype in (torch.float32, torch.bfloat16):
        logits_BV = (torch.randn(5, 300, generator=generator) * 4).to(dtype)
        tokens_B, logprobs_B = sample(logits_BV, configs, generator)
        expected_BV = torch.log_softmax(logits_BV.float() / temperature_B1, dim=-1)
        torch.testing.assert_close(logprobs_B, expected_BV.gather(1, tokens_B[:, None])[:, 0], atol=1e-5, rtol=1e-5)
        assert tokens_B[2] == logits_BV[2].float().argmax() and tokens_B[4] == logits_BV[4].float().argmax()
    print(CHECKS[0])

    vocab = 2 * triton_sampling.BLOCK_V + 700
    logits_BV = torch.randn(3, vocab, generator=generator)
    logits_BV[0, vocab - 3] = 50.0  # in the last, partial tile
    logits_BV[1, triton_sampling.BLOCK_V + 1500] = 50.0  # in a middle quarter of the second tile
    logits_BV[2, [700, 5000]] = 50.0  # equal, in two tiles: the first wins
    tokens_B, _ = sample(logits_BV, [SamplingConfig(temperature=0.0)] * 3, generator)
    assert tokens_B.tolist() == [vocab - 3, triton_sampling.BLOCK_V + 1500, 700], tokens_B
    print(CHECKS[1])

    logits_V = torch.tensor([1.0, 0.5, 0.0, -0.5, 0.25, 0.75])
    rows = 400  # each token expected at least 8 times at both temperatures, as chi-square needs
    for temperature in (1.0, 0.5):
        tokens_B, _ = sample(logits_V.repeat(rows, 1), [SamplingConfig(temperature=temperature)] * rows, generator)
        statistic = _chi_square(tokens_B, torch.softmax(logits_V.double() / temperature, -1))
        assert statistic < CHI2_5_999, (temperature, statistic)
    # The same statistic tells the two temperatures apart, so the bound above can fail.
    statistic = _chi_square(tokens_B, torch.softmax(logits_V.double(), -1))
    assert statistic > CHI2_5_999, statistic
    print(CHECKS[2])

    logits_BV = torch.randn(8, 500, generator=generator)
    first = torch.Generator().manual_seed(11)
    again = torch.Generator().manual_seed(11)
    drawn = [sample(logits_BV, [SamplingConfig()] * 8, first)[0] for _ in range(2)]
    assert torch.equal(drawn[0], sample(logits_BV, [SamplingConfig()] * 8, again)[0])
    assert not torch.equal(drawn[0], drawn[1])
    print(CHECKS[3])

    configs = [SamplingConfig(), SamplingConfig(top_p=0.9), SamplingConfig(top_k=5), SamplingConfig(temperature=0.0)]
    state = generator.get_state()
    tokens_B, logprobs_B = sample(logits_BV[:4], configs, generator)
    expected = sampling.sample_batch(logits_BV[:4], configs, torch.Generator().set_state(state))
    assert torch.equal(tokens_B, expected[0]) and torch.equal(logprobs_B, expected[1])
    print(CHECKS[4])


def compiled() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from services.engine import triton_sampling

    for dtype in ("bf16", "fp32"):
        signature = {
            "logits_ptr": f"*{dtype}",
            "stride_b": "i32",
            "scale_ptr": "*fp32",
            "greedy_ptr": "*i8",
            "seed_ptr": "*i64",
            "tokens_ptr": "*i64",
            "logprobs_ptr": "*fp32",
            "VOCAB": "constexpr",
            "BLOCK_V": "constexpr",
        }
        source = ASTSource(
            fn=triton_sampling._sample_rows,
            signature=signature,
            constexprs={"VOCAB": 151936, "BLOCK_V": triton_sampling.BLOCK_V},
        )
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        assert kernel.asm["cubin"]
    print(COMPILED[0])


if __name__ == "__main__":
    compiled() if sys.argv[1:] == ["compile"] else interpreted()
