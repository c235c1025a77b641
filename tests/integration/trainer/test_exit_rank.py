"""A rank that ends through ``exit_rank`` (as the trainer, its benches and ``relayrl sft`` do once
their work is written) exits 0 with everything it printed, and runs nothing after it."""

import sys

from tests.integration.trainer.harness import run_logged

# Its own block-buffered stdout (torchrun starts ranks unbuffered): what is still in the buffer
# at exit_rank must reach the file.
RANK = """
import sys
import torch
from services.trainer import distributed as D

ctx = D.init_distributed("cpu")
total = D.all_reduce(torch.tensor([ctx.rank + 1]))
sys.stdout = open(sys.argv[1] + f".{ctx.rank}", "w", buffering=1 << 16)
print(f"rank {ctx.rank} of {ctx.world_size}: sum {int(total)}")
D.exit_rank()
print("after exit_rank")
"""


def test_a_rank_ends_with_exit_code_0_and_its_output_written(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "relayrl.torchrun", "--standalone", "--nproc-per-node=2", str(script), str(out)]
    run_logged(cmd, tmp_path / "job.log")
    for rank in (0, 1):
        assert (tmp_path / f"out.{rank}").read_text() == f"rank {rank} of 2: sum 3\n"
