"""Settings shared by every service, and the one way to load them.

Every service defines one settings model, a subclass of :class:`ServiceSettings`, whose
fields are read from ``RELAYRL_<SERVICE>_<FIELD>`` environment variables (for example
``RELAYRL_QUEUE_GRPC_PORT``). Values that must agree across services (the run id, the API
token, the staleness bound) are read from one unprefixed name, ``RELAYRL_<FIELD>``, by
every service, so one variable sets them everywhere.

This module imports no torch, so ``relayrl --help`` and config parsing stay fast.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import AliasChoices, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

GLOBAL_PREFIX = "RELAYRL_"


class SettingsError(ValueError):
    """Raised when settings do not validate; the message names each bad variable."""

    def __init__(self, settings_name: str, problems: list[str]) -> None:
        super().__init__(f"invalid {settings_name}:\n  " + "\n  ".join(problems))
        self.settings_name = settings_name
        self.problems = problems

    def one_line(self) -> str:
        """The same message on one line, as a command prints it before it exits."""
        return f"invalid {self.settings_name}: " + "; ".join(self.problems)


def shared_field(name: str, default: Any, description: str, **kwargs: Any) -> Any:
    """A field read from the unprefixed ``RELAYRL_<NAME>`` variable by every service."""
    env_name = f"{GLOBAL_PREFIX}{name.upper()}"
    return Field(
        default,
        description=description,
        validation_alias=AliasChoices(env_name, name),
        **kwargs,
    )


class ServiceSettings(BaseSettings):
    """Fields every service has: its identity, its two ports, auth and logging.

    A subclass names its service (``service_name = "queue"``) and nothing else: its fields are
    then read from ``RELAYRL_QUEUE_<FIELD>``.
    """

    service_name: ClassVar[str] = "service"
    # Former names still accepted, each mapped to the setting that replaced it (the subclass's
    # validator gives the value to that one); setting one logs a line naming the new setting.
    former_names: ClassVar[dict[str, str]] = {}

    model_config = SettingsConfigDict(
        env_prefix=GLOBAL_PREFIX,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    run_id: str = shared_field(
        "run_id", "default", "Name of the training run; namespaces Redis keys and run directories."
    )
    api_token: SecretStr = shared_field(
        "api_token",
        SecretStr(""),
        "Bearer token required on control routes (pause, resume, checkpoint). Empty disables auth,"
        " which is only sensible on a developer machine.",
    )
    stall_warn_s: float = shared_field(
        "stall_warn_s",
        30.0,
        "A wait on another service (groups, prompts, weights, an engine, the queue) that makes no progress"
        " for this many seconds is logged once, naming what is awaited and from whom, and exported as"
        " relayrl_<service>_stalled_seconds.",
        gt=0,
    )
    host: str = Field("127.0.0.1", description="Address the gRPC and HTTP servers bind to.")
    grpc_port: int = Field(0, ge=0, le=65535, description="gRPC port; 0 picks a free port.")
    http_port: int = Field(
        0, ge=0, le=65535, description="HTTP port for /healthz, /readyz, /metrics and control; 0 picks one."
    )
    log_level: str = Field("INFO", description="Python logging level name.")
    log_format: str = Field("text", pattern="^(text|json)$", description="'text' for people, 'json' for log shippers.")

    def former_names_set(self) -> dict[str, str]:
        """The former names this instance was given, each with the name that replaced it."""
        return {old: new for old, new in self.former_names.items() if old in self.model_fields_set}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # pydantic-settings reads env_prefix when settings are loaded, so setting it here is enough.
        cls.model_config = {**cls.model_config, "env_prefix": service_env_prefix(cls.service_name)}


def service_env_prefix(service_name: str) -> str:
    """``RELAYRL_<SERVICE>_``: where a service's own settings are read from."""
    return f"{GLOBAL_PREFIX}{service_name.upper()}_"


S = TypeVar("S", bound=BaseSettings)


def env_var_name(settings_cls: type[BaseSettings], field_name: str) -> str:
    """The environment variable that sets ``field_name`` of ``settings_cls``."""
    field = settings_cls.model_fields.get(field_name)
    alias = field.validation_alias if field is not None else None
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    prefix = settings_cls.model_config.get("env_prefix", "")
    return f"{prefix}{field_name}".upper()


def former_name_line(settings_cls: type[BaseSettings], old: str, new: str) -> str:
    """The warning for a variable set under its former name, naming both variables."""
    return (
        f"{env_var_name(settings_cls, old)} is deprecated: it is the former name of"
        f" {env_var_name(settings_cls, new)} ({new}), which it sets; rename it"
    )


def load_settings(settings_cls: type[S], **overrides: Any) -> S:
    """Builds ``settings_cls`` from the environment plus ``overrides``.

    Raises :class:`SettingsError` whose message names the environment variable of every
    field that failed, with the value given and why it was refused.
    """
    try:
        return settings_cls(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            field_name = str(err["loc"][0]) if err["loc"] else "?"
            variable = env_var_name(settings_cls, field_name)
            given = err.get("input")
            shown = "" if isinstance(given, dict) else f" (got {given!r})"
            problems.append(f"{variable}: {err['msg']}{shown}")
        raise SettingsError(settings_cls.__name__, problems) from None
