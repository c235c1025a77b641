"""One way for ``relayrl <service> serve`` (and ``relayrl trainer run``) to start: the service's
settings from ``RELAYRL_*`` with the command's options on top, then logging set up in the
service's name. A bad setting ends the command before anything starts, with exit code 2 and one
line on stderr naming every bad variable."""

from __future__ import annotations

import logging
from typing import Any, TypeVar

import typer

from relayrl.config import ServiceSettings, SettingsError, env_var_name, former_name_line, load_settings
from relayrl.logs import setup_logging

log = logging.getLogger(__name__)

S = TypeVar("S", bound=ServiceSettings)


def settings_or_exit(settings_cls: type[S], required: dict[str, str] | None = None, **options: Any) -> S:
    """``settings_cls`` loaded with the options that were given (``None`` means not given).

    ``required`` maps fields that this command cannot start without (optional in the settings,
    which other commands share) to the option that gives them, for the error line.
    """
    try:
        settings = load_settings(settings_cls, **{k: v for k, v in options.items() if v is not None})
        missing = [
            f"{env_var_name(settings_cls, name)}: required (pass {option})"
            for name, option in (required or {}).items()
            if not getattr(settings, name)
        ]
        if missing:
            raise SettingsError(settings_cls.__name__, missing)
    except SettingsError as err:
        typer.echo(err.one_line(), err=True)
        raise typer.Exit(2) from None
    setup_logging(settings_cls.service_name, settings.log_level, settings.log_format)
    for old, new in settings.former_names_set().items():
        log.warning(former_name_line(settings_cls, old, new))
    return settings
