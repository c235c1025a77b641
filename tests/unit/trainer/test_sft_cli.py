import pytest
from typer.testing import CliRunner

from relayrl.cli import app


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_bad_setting_stops_sft_before_any_rank_starts_and_names_the_variable(monkeypatch, tmp_path, nproc):
    monkeypatch.setenv("RELAYRL_SFT_MAX_LENGTH", "1")
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), "--nproc", nproc]
    result = CliRunner().invoke(app, [*args, "--lr", "-1"])
    assert result.exit_code == 2
    assert "RELAYRL_SFT_LR" in result.output and "RELAYRL_SFT_MAX_LENGTH" in result.output
    assert not (tmp_path / "o").exists()


def test_sft_needs_its_data(tmp_path):
    result = CliRunner().invoke(app, ["sft", "--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "RELAYRL_SFT_DATA" in result.output


def test_a_micro_batch_larger_than_the_batch_is_refused_by_name(tmp_path):
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--train-batch-size", "4", "--micro-batch-size-per-gpu", "8"])
    assert result.exit_code == 2
    assert "RELAYRL_SFT_MICRO_BATCH_SIZE_PER_GPU" in result.output and "exceeds train_batch_size (4)" in result.output


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_before_launch(tmp_path):
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), "--nproc", "3"]
    result = CliRunner().invoke(app, [*args, "--train-batch-size", "8", "--micro-batch-size-per-gpu", "1"])
    assert result.exit_code == 2 and "RELAYRL_SFT_TRAIN_BATCH_SIZE" in result.output
