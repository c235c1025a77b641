"""One rank that ends through ``exit_rank`` (launched by torchrun from test_exit_rank.py): it prints
one line to its own block-buffered stdout, OUT.<rank> (torchrun starts ranks unbuffered), so what
is still in the buffer at exit_rank must reach the file; then a line that must never be written."""

from __future__ import annotations

import sys

import torch

from services.trainer import distributed as D


def main(out: str) -> None:
    ctx = D.init_distributed("cpu")
    total = D.all_reduce(torch.tensor([ctx.rank + 1]))
    sys.stdout = open(f"{out}.{ctx.rank}", "w", buffering=1 << 16)  # noqa: SIM115 - exit_rank flushes it
    print(f"rank {ctx.rank} of {ctx.world_size}: sum {int(total)}")
    D.exit_rank()
    print("after exit_rank")


if __name__ == "__main__":
    main(sys.argv[1])
