"""The engine's profiler as SGLang's /start_profile counts: it begins at forward pass ``start_step``
(or now), stops by itself ``num_steps`` passes later, and writes the trace and the summary."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from services.engine.profiler import EngineProfiler, ProfileError, ProfileRequest


def test_a_profile_begins_at_its_start_step_and_ends_num_steps_later(tmp_path: Path) -> None:
    profiler = EngineProfiler(torch.device("cpu"), str(tmp_path / "default"))
    profiler.start(ProfileRequest(output_dir=str(tmp_path), start_step=12, num_steps=2), passes=10)

    a = torch.randn(384, 384)
    for passes in (10, 11, 12, 13):
        a = a @ a.T / 384  # a pass's work: milliseconds, so its time survives the summary's rounding
        profiler.observe(passes)
        assert not list(tmp_path.glob("*.summary.json")), "not before num_steps passes from its start"
    profiler.observe(14)

    (summary_path,) = tmp_path.glob("*-TP-0.summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["device"] == "cpu" and summary["by_kind"]["matmul"] > 0
    (trace,) = tmp_path.glob("*-TP-0.trace.json.gz")
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert not (tmp_path / "default").exists()
    with pytest.raises(ProfileError, match="not in progress"):
        profiler.stop()


def test_a_profile_stopped_before_its_start_step_says_so(tmp_path: Path) -> None:
    profiler = EngineProfiler(torch.device("cpu"), str(tmp_path))
    profiler.start(ProfileRequest(start_step=100), passes=0)

    summary = json.loads(profiler.stop().read_text())

    assert summary == {"error": "stopped before its start_step"}
    assert not list(tmp_path.glob("*.trace.json.gz"))


def test_an_output_dir_that_cannot_be_made_is_refused_and_nothing_starts(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    profiler = EngineProfiler(torch.device("cpu"), str(tmp_path))

    with pytest.raises(ProfileError, match="cannot be created"):
        profiler.start(ProfileRequest(output_dir=str(tmp_path / "file" / "below")), passes=0)
    profiler.start(ProfileRequest(output_dir=str(tmp_path), num_steps=1), passes=0)
    profiler.observe(1)
    assert len(list(tmp_path.glob("*.summary.json"))) == 1
