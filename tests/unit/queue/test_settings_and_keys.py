"""Queue settings come from the documented variables; Redis keys are namespaced per run."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import SSLConnection

from relayrl.config import SettingsError, load_settings
from services.queue.config import QueueSettings
from services.queue.keys import Keys, is_entry_id
from services.queue.redis_conn import connect


def test_settings_read_queue_and_shared_variables(monkeypatch):
    monkeypatch.setenv("RELAYRL_QUEUE_CAPACITY", "64")
    monkeypatch.setenv("RELAYRL_REDIS_URL", "redis://10.0.0.5:6380/2")
    monkeypatch.setenv("RELAYRL_RUN_ID", "exp-7")
    settings = load_settings(QueueSettings)
    assert (settings.capacity, settings.redis_url, settings.run_id) == (64, "redis://10.0.0.5:6380/2", "exp-7")


def test_bad_values_name_their_variable(monkeypatch):
    monkeypatch.setenv("RELAYRL_QUEUE_MAX_DELIVERIES", "0")
    monkeypatch.setenv("RELAYRL_QUEUE_REDIS_APPENDFSYNC", "sometimes")
    with pytest.raises(SettingsError) as err:
        load_settings(QueueSettings)
    assert "RELAYRL_QUEUE_MAX_DELIVERIES" in str(err.value)
    assert "RELAYRL_QUEUE_REDIS_APPENDFSYNC" in str(err.value)


def test_every_setting_is_documented():
    undocumented = [name for name, field in QueueSettings.model_fields.items() if not field.description]
    assert undocumented == []


def test_keys_are_namespaced_by_run():
    a, b = Keys("run-a"), Keys("run-b")
    assert a.trajectories == "relayrl:run-a:trajectories"
    assert a.stale == "relayrl:run-a:stale" and a.dead_letter == "relayrl:run-a:dead_letter"
    every = [getattr(a, name) for name in dir(Keys) if isinstance(getattr(Keys, name), property)]
    assert len(set(every)) == len(every)
    assert not set(every) & {getattr(b, name) for name in dir(Keys) if isinstance(getattr(Keys, name), property)}


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ("0-0", True),
        ("1764500000000-3", True),
        (f"{2**64 - 1}-{2**64 - 1}", True),
        (f"{2**64}-0", False),
        (f"1-{2**64}", False),
        ("\u0661-\u0662", False),  # Arabic-Indic digits: Python's \d takes them, Redis does not
        ("1-", False),
        ("1-2-3", False),
        (" 1-2", False),
        ("1-2\n", False),
    ],
)
def test_an_entry_id_is_what_redis_takes_as_a_stream_id(text, taken):
    assert is_entry_id(text) is taken


async def test_tls_and_acl_settings_reach_the_redis_client():
    settings = QueueSettings(
        redis_url="redis://cache:6379/0",
        redis_tls=True,
        redis_tls_ca_file="/etc/ca.pem",
        redis_username="relayrl",
        redis_password="s3cret",
    )
    client = connect(settings)  # connects lazily; no socket here
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is SSLConnection
    assert (kwargs["username"], kwargs["password"], kwargs["ssl_ca_certs"]) == ("relayrl", "s3cret", "/etc/ca.pem")
    await client.aclose()
