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
