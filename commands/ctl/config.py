"""Where ``relayrl ctl`` finds each component, read from ``RELAYRL_CTL_*`` (and the shared token).

Example for a local stack::

    export RELAYRL_CTL_ROLLOUT_URLS=http://127.0.0.1:8101,http://127.0.0.1:8102
    export RELAYRL_CTL_TRAINER_URL=http://127.0.0.1:8200
    export RELAYRL_CTL_QUEUE_ADDRESS=127.0.0.1:50051
    export RELAYRL_CTL_PARAMSYNC_ADDRESS=127.0.0.1:50052
    export RELAYRL_API_TOKEN=...

The same variables may sit in a dotenv file passed with ``relayrl ctl --env-file FILE``
(:func:`env_file_text` writes one).
A component left empty is reported as "not configured" rather than guessed.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from relayrl.config import shared_field


class CtlSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RELAYRL_CTL_", populate_by_name=True, extra="forbid", validate_default=True
    )

    api_token: SecretStr = shared_field(
        "api_token",
        SecretStr(""),
        "Bearer token sent to control routes (RELAYRL_API_TOKEN, the same variable the services read).",
    )
    rollout_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="HTTP base URLs of the rollout replicas (their http_port), comma-separated. Default: none.",
    )
    trainer_url: str = Field("", description="HTTP base URL of the trainer (global rank 0). Default: none.")
    queue_address: str = Field("", description="gRPC host:port of the queue service. Default: none.")
    queue_url: str = Field(
        "", description="HTTP base URL of the queue service (`relayrl ctl group` asks it). Default: none."
    )
    paramsync_address: str = Field("", description="gRPC host:port of paramsync. Default: none.")
    timeout_s: float = Field(5.0, gt=0, description="Seconds to wait for each call before calling it failed.")
    restarts_file: str = Field(
        "",
        description="restarts.json of a local stack (`relayrl up` writes it): restarts per component."
        " Default: none (on Kubernetes, `kubectl get pods` shows restarts).",
    )

    @field_validator("rollout_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        # Accept both spellings users reach for: a JSON list, or URLs separated by commas.
        if isinstance(value, str) and value.lstrip().startswith("["):
            return json.loads(value)
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("rollout_urls")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        return [_http_url(url) for url in urls]

    @field_validator("trainer_url", "queue_url")
    @classmethod
    def _check_url(cls, url: str) -> str:
        return _http_url(url) if url else url

    @field_validator("queue_address", "paramsync_address")
    @classmethod
    def _check_address(cls, address: str) -> str:
        host, sep, port = address.rpartition(":")
        if address and not (sep and host and port.isdigit()):
            raise ValueError(f"expected host:port, got {address!r}")
        return address


def _http_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


def env_file_text(
    api_token: str,
    rollout_urls: list[str],
    trainer_url: str,
    queue_address: str,
    paramsync_address: str,
    restarts_file: str = "",
    queue_url: str = "",
) -> str:
    """A dotenv file for ``relayrl ctl --env-file`` pointing at one deployment (what ``relayrl up`` can write)."""
    lines = {
        "RELAYRL_API_TOKEN": api_token,
        "RELAYRL_CTL_ROLLOUT_URLS": ",".join(rollout_urls),
        "RELAYRL_CTL_TRAINER_URL": trainer_url,
        "RELAYRL_CTL_QUEUE_ADDRESS": queue_address,
        "RELAYRL_CTL_PARAMSYNC_ADDRESS": paramsync_address,
        "RELAYRL_CTL_RESTARTS_FILE": restarts_file,
        "RELAYRL_CTL_QUEUE_URL": queue_url,
    }
    return "".join(f"{name}={value}\n" for name, value in lines.items())
