import pytest

from relayrl.config import SettingsError, load_settings
from services.trainer.config import TrainerSettings


def test_staleness_bound_is_the_shared_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_MAX_STALENESS", "0")
    monkeypatch.setenv("RELAYRL_TRAINER_BATCH_SIZE", "8")
    s = load_settings(TrainerSettings)
    assert s.max_staleness == 0 and s.batch_size == 8


def test_checkpoints_must_fall_on_publish_boundaries():
    with pytest.raises(SettingsError, match=r"save_freq \(3\) must be a multiple of sync_every \(2\)"):
        load_settings(TrainerSettings, sync_every=2, save_freq=3)


def test_the_former_name_of_save_freq_still_sets_it_and_is_named_in_its_errors():
    assert load_settings(TrainerSettings).save_freq == 8
    settings = load_settings(TrainerSettings, sync_every=2, checkpoint_every=4)
    assert settings.save_freq == 4 and settings.former_names_set() == {"checkpoint_every": "save_freq"}
    assert load_settings(TrainerSettings, save_freq=4).former_names_set() == {}
    with pytest.raises(SettingsError, match=r"checkpoint_every \(3\) must be a multiple of sync_every \(2\)"):
        load_settings(TrainerSettings, sync_every=2, checkpoint_every=3)


def test_unknown_algorithm_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_TRAINER_ADV_ESTIMATOR", "ppo2")
    with pytest.raises(SettingsError, match="RELAYRL_TRAINER_ADV_ESTIMATOR"):
        load_settings(TrainerSettings)


def test_every_field_is_documented():
    assert all(f.description for f in TrainerSettings.model_fields.values())


def test_logger_is_console_by_default_and_a_list_in_any_env_spelling(monkeypatch):
    assert load_settings(TrainerSettings).logger == ["console"]
    for spelling in ('["console", "tensorboard"]', "['console','tensorboard']", "console,tensorboard"):
        monkeypatch.setenv("RELAYRL_TRAINER_LOGGER", spelling)
        assert load_settings(TrainerSettings).logger == ["console", "tensorboard"], spelling
    monkeypatch.setenv("RELAYRL_TRAINER_LOGGER", "wandb")
    assert load_settings(TrainerSettings).logger == ["wandb"]
    monkeypatch.delenv("RELAYRL_TRAINER_LOGGER")
    assert load_settings(TrainerSettings, logger=["tensorboard", "wandb"]).logger == ["tensorboard", "wandb"]


def test_an_unknown_logger_names_the_variable_and_the_choices(monkeypatch):
    monkeypatch.setenv("RELAYRL_TRAINER_LOGGER", '["console", "tensorbord"]')
    with pytest.raises(SettingsError) as info:
        load_settings(TrainerSettings)
    message = str(info.value)
    assert "RELAYRL_TRAINER_LOGGER" in message and "'console', 'tensorboard' or 'wandb'" in message
    assert "'tensorbord'" in message


def test_param_dtype_auto_computes_in_bf16_on_cuda_and_fp32_on_cpu(monkeypatch):
    assert not TrainerSettings().bf16_compute
    assert TrainerSettings(device="cuda").bf16_compute
    assert TrainerSettings(param_dtype="bf16").bf16_compute
    assert not TrainerSettings(device="cuda", param_dtype="fp32").bf16_compute
    monkeypatch.setenv("RELAYRL_TRAINER_PARAM_DTYPE", "fp16")
    with pytest.raises(SettingsError, match="RELAYRL_TRAINER_PARAM_DTYPE"):
        load_settings(TrainerSettings)
