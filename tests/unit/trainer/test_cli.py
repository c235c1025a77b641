import pytest
from typer.testing import CliRunner

from commands.cli import app as relayrl_cli
from relayrl.devices import cuda_unavailable_reason
from services.trainer.cli import app


def test_bad_setting_stops_before_anything_starts_and_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_TRAINER_BATCH_SIZE", "0")
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 2
    assert "RELAYRL_TRAINER_BATCH_SIZE" in result.output


@pytest.mark.skipif(cuda_unavailable_reason() is None, reason="this machine has a usable GPU")
def test_bench_on_cuda_without_a_gpu_stops_at_once_with_one_line():
    result = CliRunner().invoke(relayrl_cli, ["bench", "trainer", "--device", "cuda"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and result.output.startswith("--device: cuda requested but")
