"""A rank that ends through ``exit_rank`` (as the trainer, its benches and ``relayrl sft`` do once
their work is written) exits 0 with everything it printed, and runs nothing after it."""

from tests.integration.trainer.harness import run_logged, torchrun


def test_a_rank_ends_with_exit_code_0_and_its_output_written(tmp_path):
    out = tmp_path / "out"
    run_logged(torchrun(2, "tests.integration.trainer.exit_worker", str(out)), tmp_path / "job.log")
    for rank in (0, 1):
        assert (tmp_path / f"out.{rank}").read_text() == f"rank {rank} of 2: sum 3\n"
