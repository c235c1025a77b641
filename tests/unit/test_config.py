from typing import ClassVar

import pytest
from pydantic import Field

from relayrl.config import ServiceSettings, SettingsError, load_settings


class DemoSettings(ServiceSettings):
    service_name: ClassVar[str] = "demo"

    batch_size: int = Field(4, ge=1, description="Groups per step.")


def test_prefixed_variable_sets_the_field(monkeypatch):
    monkeypatch.setenv("RELAYRL_DEMO_BATCH_SIZE", "16")
    assert load_settings(DemoSettings).batch_size == 16


def test_shared_variable_is_read_unprefixed(monkeypatch):
    monkeypatch.setenv("RELAYRL_RUN_ID", "exp-7")
    monkeypatch.setenv("RELAYRL_API_TOKEN", "s3cret")
    settings = load_settings(DemoSettings)
    assert settings.run_id == "exp-7"
    assert settings.api_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(settings)


def test_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_DEMO_BATCH_SIZE", "many")
    with pytest.raises(SettingsError) as err:
        load_settings(DemoSettings)
    assert "RELAYRL_DEMO_BATCH_SIZE" in str(err.value)
    assert "'many'" in str(err.value)


def test_out_of_range_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_DEMO_GRPC_PORT", "70000")
    with pytest.raises(SettingsError, match="RELAYRL_DEMO_GRPC_PORT"):
        load_settings(DemoSettings)


def test_every_bad_field_is_reported_at_once(monkeypatch):
    monkeypatch.setenv("RELAYRL_DEMO_BATCH_SIZE", "0")
    monkeypatch.setenv("RELAYRL_DEMO_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError) as err:
        load_settings(DemoSettings)
    assert "RELAYRL_DEMO_BATCH_SIZE" in str(err.value) and "RELAYRL_DEMO_LOG_FORMAT" in str(err.value)


def test_unknown_override_is_rejected():
    with pytest.raises(SettingsError, match="RELAYRL_DEMO_BATCH_SISE"):
        load_settings(DemoSettings, batch_sise=3)
