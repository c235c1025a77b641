"""``relayrl bench logprobs`` on a CPU: the eager and the fused statistics, side by side, in one JSON line."""

import json

import pytest
from typer.testing import CliRunner

from commands.cli import app

# The bench imports torch when it runs, inside the CLI runner, which would report its absence as exit code 1.
pytest.importorskip("torch")


def test_bench_logprobs_times_eager_and_fused_statistics_side_by_side() -> None:
    argv = ["bench", "logprobs", "--tokens", "70", "--width", "16", "--vocab", "300", "--rounds", "1"]
    result = CliRunner().invoke(app, argv)

    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["tokens"] == 70 and figures["eager_s"] > 0 and figures["fused_s"] > 0
    # From the unrounded times: within the rounding of milliseconds' tenths.
    assert figures["speedup"] == pytest.approx(figures["eager_s"] / figures["fused_s"], rel=0.1)
