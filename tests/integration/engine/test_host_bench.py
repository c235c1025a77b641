"""``relayrl bench engine-host``: the real engine process with its model's pass simulated."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from commands.cli import app
from relayrl.models.tiny import preset_spec
from services.engine.bench import Workload
from services.engine.host_bench import SimulatedGPU, run_host_bench


def test_a_simulated_pass_answers_each_rows_last_token_plus_one() -> None:
    gpu = SimulatedGPU(decode_s=0.0, prefill_s_per_token=0.0)
    runner = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=10)))

    logits = gpu.forward_logits(runner, torch.tensor([[0, 3], [0, 9]]), torch.zeros(2, 2, dtype=torch.long), None)

    assert logits.argmax(-1).tolist() == [4, 0]


def test_a_read_back_waits_for_the_passes_queued_before_it_and_not_for_those_after() -> None:
    gpu = SimulatedGPU(decode_s=0.5, prefill_s_per_token=0.0)
    runner = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=10)))
    one_token = (torch.tensor([[1]]), torch.zeros(1, 1, dtype=torch.long), None)
    started = time.perf_counter()
    gpu.forward_logits(runner, *one_token)
    wait = gpu.read_back(torch.tensor([7]))
    gpu.forward_logits(runner, *one_token)  # the next step's pass, queued before the host waits

    assert wait() == [7]
    assert time.perf_counter() - started >= 0.5
    assert time.perf_counter() < gpu.free_at  # the second pass is still running


def test_every_pass_streams_the_whole_workload_and_a_decode_wait_is_in_every_step() -> None:
    result = run_host_bench(12, 8, 24, decode_ms=[0, 20], prefill_us_per_token=3.0, stream_interval=1)

    lengths = Workload.nano_vllm(12, 8, 24, preset_spec("tiny").vocab_size).output_lens
    assert set(result["passes"]) == {"0ms", "20ms"}
    assert all(figures["output_tokens"] == sum(lengths) for figures in result["passes"].values())
    # Each token after a request's first is a decode pass of its own, and the simulated GPU runs
    # its 20 ms passes one after another: the longest answer takes at least that many of them.
    assert result["passes"]["20ms"]["wall_s"] >= (max(lengths) - 1) * 0.020
    # A dozen rows are little host work against a 20 ms pass: the host spends most of each step
    # waiting for the device, and with no wait at all, next to none. (Against 5 ms passes the
    # share swung between 0.48 and 0.78 from run to run on a slow day: a step's wait also counts
    # until the serving thread hands back the GIL, which Python does every 5 ms.)
    assert result["passes"]["20ms"]["device_wait_share"] > 0.5
    assert result["passes"]["0ms"]["device_wait_share"] < 0.2


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--decode-ms", "fast"], "--decode-ms"),
        # Two engines with one wait: the second's figures would replace the first's.
        (["--decode-ms", "3,3.0"], "--decode-ms"),
        (["--min-len", "64", "--max-len", "32"], "--min-len"),
    ],
)
def test_the_command_refuses_what_it_cannot_run_naming_the_option(options: list[str], named: str) -> None:
    outcome = CliRunner().invoke(app, ["bench", "engine-host", *options])

    assert outcome.exit_code == 2
    assert named in outcome.output


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_the_command_prints_one_json_line_naming_the_engines_schedule(overlap: bool) -> None:
    options = ["--requests", "4", "--min-len", "4", "--max-len", "8", "--decode-ms", "1"]
    options += [] if overlap else ["--no-overlap-schedule"]

    outcome = CliRunner().invoke(app, ["bench", "engine-host", *options])

    assert outcome.exit_code == 0, outcome.output
    figures = json.loads(outcome.output.strip().splitlines()[-1])["passes"]["1ms"]
    assert figures["output_tokens"] > 0 and figures["overlap_schedule"] is overlap
