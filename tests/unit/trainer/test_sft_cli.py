import pytest
from typer.testing import CliRunner

from commands.cli import app
from relayrl.config import load_settings
from services.trainer.sft.config import SftSettings


def refused(result, *variables: str) -> bool:
    """Exit 2 with one line on stderr naming every variable, nothing on stdout (no rank started)."""
    lines = result.stderr.strip().splitlines()
    return result.exit_code == 2 and len(lines) == 1 and all(v in lines[0] for v in variables) and not result.stdout


@pytest.mark.parametrize("nproc", ["1", "2"])
def test_a_bad_setting_stops_sft_before_any_rank_starts_and_names_the_variable(monkeypatch, tmp_path, nproc):
    monkeypatch.setenv("RELAYRL_SFT_MAX_LENGTH", "1")
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), "--nproc", nproc]
    result = CliRunner().invoke(app, [*args, "--lr", "-1"])
    assert refused(result, "RELAYRL_SFT_LR", "RELAYRL_SFT_MAX_LENGTH"), result.output
    assert not (tmp_path / "o").exists()


def test_sft_needs_its_data(tmp_path):
    result = CliRunner().invoke(app, ["sft", "--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert refused(result, "RELAYRL_SFT_DATA"), result.output


def test_a_micro_batch_larger_than_the_batch_is_refused_by_name(tmp_path):
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, [*args, "--train-batch-size", "4", "--micro-batch-size-per-gpu", "8"])
    assert refused(result, "RELAYRL_SFT_MICRO_BATCH_SIZE_PER_GPU", "exceeds train_batch_size (4)"), result.output


def test_a_batch_that_does_not_split_over_the_ranks_is_refused_before_launch(tmp_path):
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), "--nproc", "3"]
    result = CliRunner().invoke(app, [*args, "--train-batch-size", "8", "--micro-batch-size-per-gpu", "1"])
    assert refused(result, "RELAYRL_SFT_TRAIN_BATCH_SIZE"), result.output


def test_settings_come_from_relayrl_sft_variables_with_verls_defaults(monkeypatch):
    monkeypatch.setenv("RELAYRL_SFT_MODEL_DIR", "m")
    monkeypatch.setenv("RELAYRL_SFT_DATA", "builtin:copy")
    monkeypatch.setenv("RELAYRL_SFT_OUT_DIR", "o")
    monkeypatch.setenv("RELAYRL_SFT_TRUNCATION", "left")
    s = load_settings(SftSettings)
    assert (s.data, s.truncation, s.max_length, s.micro_batch_size_per_gpu, s.clip_grad) == (
        "builtin:copy",
        "left",
        1024,
        4,
        1.0,
    )
    assert (s.betas, s.lr_scheduler_type, s.min_lr_ratio, s.adam_eps) == ((0.9, 0.999), "constant", 0.0, 1e-8)
    assert all(f.description for f in SftSettings.model_fields.values())


@pytest.mark.parametrize("value", ["0.9,0.95", "[0.9, 0.95]"])
def test_betas_come_from_the_environment_as_the_trainers_do(monkeypatch, value):
    monkeypatch.setenv("RELAYRL_SFT_BETAS", value)
    assert SftSettings(model_dir="m", data="d", out_dir="o").betas == (0.9, 0.95)


def test_bad_betas_stop_sft_before_any_rank_starts(monkeypatch, tmp_path):
    monkeypatch.setenv("RELAYRL_SFT_BETAS", "0.9,1.5")
    args = ["sft", "--model", str(tmp_path), "--data", "d.jsonl", "--out", str(tmp_path / "o"), "--nproc", "2"]
    assert refused(CliRunner().invoke(app, args), "RELAYRL_SFT_BETAS")


def test_a_missing_model_directory_is_one_line_not_a_traceback(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "q", "response": "a"}\n')
    args = ["sft", "--model", str(tmp_path / "none"), "--data", str(data), "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert refused(result, "no config.json"), result.output
