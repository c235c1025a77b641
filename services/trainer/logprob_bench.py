"""``relayrl bench logprobs``: the trainer's log-probs from hidden states, eager and fused, side by side.

One policy pass's log-probs and entropies over ``tokens`` response tokens with the output head of
Qwen2.5-0.5B's shape (896 wide, 151,936 rows; bf16 on cuda, as FSDP's mixed precision computes),
forward and backward through the chunks' checkpoints, as the actor's update takes them
(:func:`services.trainer.model.token_logprobs`): once with the statistics over the vocabulary in
eager torch, once compiled (the default on CUDA). Each figure is the median over rounds, taken in
turns; the first call of each is left out (the compile).
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated, Any

import typer

from relayrl.devices import bench_gpu_name, check_bench_device


def run_logprob_bench(device: str, tokens: int, width: int, vocab: int, dtype: str, rounds: int) -> dict[str, Any]:
    import torch

    from services.trainer.model import LOGPROB_CHUNK_TOKENS, token_logprobs

    target = torch.device(device)
    generator = torch.Generator(device=target).manual_seed(0)
    head = torch.nn.Linear(width, vocab, bias=False, device=target, dtype=getattr(torch, dtype))
    hidden = torch.randn((tokens, width), generator=generator, device=target, dtype=head.weight.dtype)
    hidden.requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator, device=target)
    weights = torch.randn(tokens, generator=generator, device=target)

    def step(fused: bool) -> float:
        started = time.perf_counter()
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        logp, entropy = token_logprobs(head, hidden, targets, 1.0, True, fused=fused)
        (weights * logp + 0.01 * weights * entropy).sum().backward()
        if target.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    times: dict[str, list[float]] = {"eager": [], "fused": []}
    for fused in (False, True):
        step(fused)
    for _ in range(rounds):
        for name, fused in (("eager", False), ("fused", True)):
            times[name].append(step(fused))
    eager, fused_s = statistics.median(times["eager"]), statistics.median(times["fused"])
    return {
        "bench": "logprobs",
        "device": device,
        "gpu": bench_gpu_name(device),
        "tokens": tokens,
        "chunk_tokens": LOGPROB_CHUNK_TOKENS,
        "width": width,
        "vocab": vocab,
        "dtype": dtype,
        "rounds": rounds,
        "eager_s": round(eager, 4),
        "fused_s": round(fused_s, 4),
        "speedup": round(eager / fused_s, 2),
    }


def bench(
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON line (the default format).")] = True,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    tokens: Annotated[int, typer.Option(min=0, help="Response tokens of the pass; 0: 16384 on cuda, 2048 on cpu.")] = 0,
    width: Annotated[int, typer.Option(min=1, help="Hidden size (Qwen2.5-0.5B: 896).")] = 896,
    vocab: Annotated[int, typer.Option(min=2, help="Vocabulary size (Qwen2.5: 151,936).")] = 151936,
    rounds: Annotated[int, typer.Option(min=1, help="Rounds; each figure is their median.")] = 3,
) -> None:
    """The trainer's log-probs and entropy from hidden states (forward and backward), eager and fused, side by
    side: seconds per pass."""
    import json

    check_bench_device(device)
    tokens = tokens or (16384 if device == "cuda" else 2048)
    if tokens < 2:
        raise typer.BadParameter(f"{tokens}: give at least 2 tokens", param_hint="--tokens")
    dtype = "bfloat16" if device == "cuda" else "float32"
    typer.echo(json.dumps(run_logprob_bench(device, tokens, width, vocab, dtype, rounds)))
