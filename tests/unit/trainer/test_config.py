import pytest

from relayrl.config import SettingsError, load_settings
from services.trainer.config import TrainerSettings


def test_staleness_bound_is_the_shared_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_MAX_STALENESS", "0")
    monkeypatch.setenv("RELAYRL_TRAINER_BATCH_SIZE", "8")
    s = load_settings(TrainerSettings)
    assert s.max_staleness == 0 and s.batch_size == 8


def test_checkpoints_must_fall_on_publish_boundaries():
    with pytest.raises(SettingsError, match="multiple of sync_every"):
        load_settings(TrainerSettings, sync_every=2, checkpoint_every=3)


def test_unknown_algorithm_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_TRAINER_ADV_ESTIMATOR", "ppo2")
    with pytest.raises(SettingsError, match="RELAYRL_TRAINER_ADV_ESTIMATOR"):
        load_settings(TrainerSettings)


def test_every_field_is_documented():
    assert all(f.description for f in TrainerSettings.model_fields.values())
