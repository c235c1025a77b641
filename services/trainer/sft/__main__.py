"""``python -m services.trainer.sft``: one rank, what ``relayrl sft --nproc N`` starts under torchrun."""

import typer

from services.trainer.sft.cli import run_rank

if __name__ == "__main__":
    typer.run(run_rank)
