from typer.testing import CliRunner

from services.trainer.cli import app


def test_bad_setting_stops_before_anything_starts_and_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_TRAINER_BATCH_SIZE", "0")
    result = CliRunner().invoke(app, ["run"])
    assert result.exit_code == 2
    assert "RELAYRL_TRAINER_BATCH_SIZE" in result.output
