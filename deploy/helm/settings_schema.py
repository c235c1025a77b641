"""Writes each service's settings model into the chart's values.schema.json.

``<service>.settings`` in the chart's values becomes ``RELAYRL_<SERVICE>_<FIELD>`` variables. A
service ignores variables it does not know, so a misspelled field would be lost silently; instead
the chart's schema lists exactly the fields of each settings class (types, enums, bounds,
descriptions), and ``helm install`` rejects anything else. Left out on purpose:

- ``host``, ``grpc_port``, ``http_port``, ``data_port``: the chart sets them to match the Services;
- shared fields (``RELAYRL_<NAME>``, e.g. max_staleness, redis_url): set once under ``run``/``redis``;
- secrets (SecretStr fields): they come from Secrets only, never from a ConfigMap.

Run after changing a settings class (a unit test fails while the schema is stale):
``.venv/bin/python deploy/helm/settings_schema.py``
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings

SCHEMA_PATH = Path(__file__).parent / "relayrl" / "values.schema.json"

# values key → the settings class whose fields it takes.
SETTINGS_CLASSES = {
    "queue": "services.queue.config:QueueSettings",
    "paramsync": "services.paramsync.config:ParamSyncSettings",
    "rollout": "services.rollout.config:RolloutSettings",
    "engine": "services.engine.config:EngineSettings",
    "trainer": "services.trainer.config:TrainerSettings",
    "reward": "services.reward.config:RewardSettings",
}

CHART_OWNED = frozenset({"host", "grpc_port", "http_port", "data_port"})
# Set per pod by the chart (the pod name), so not a release-wide setting.
POD_OWNED = {"rollout": frozenset({"replica_id"})}
_KEPT_KEYWORDS = (
    "type",
    "enum",
    "const",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "items",
    "minItems",
    "maxItems",
    "anyOf",
)


def load_class(path: str) -> type[BaseSettings]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def settable_fields(settings_cls: type[BaseSettings], key: str) -> list[str]:
    """Fields a user may set through ``<key>.settings``."""
    owned = CHART_OWNED | POD_OWNED.get(key, frozenset())
    names = []
    for name, field in settings_cls.model_fields.items():
        shared = field.validation_alias is not None
        secret = field.annotation is SecretStr
        if not (shared or secret or name in owned):
            names.append(name)
    return names


def _field_schema(prop: dict[str, Any]) -> dict[str, Any]:
    schema = {key: prop[key] for key in _KEPT_KEYWORDS if key in prop}
    if "anyOf" in schema:
        # An env var cannot be null: Optional fields accept only their non-null form.
        options = [option for option in schema.pop("anyOf") if option.get("type") != "null"]
        schema.update(options[0] if len(options) == 1 else {"anyOf": options})
    schema.pop("format", None)
    if "prefixItems" in prop:
        # A tuple: the chart's schema is draft-07, which spells positional items as a list under "items".
        schema["items"] = [_field_schema(item) for item in prop["prefixItems"]]
    if "description" in prop:
        schema["description"] = prop["description"]
    return schema


def settings_schema(settings_cls: type[BaseSettings], key: str) -> dict[str, Any]:
    props = settings_cls.model_json_schema(by_alias=False)["properties"]
    return {
        "type": "object",
        "description": f"Fields of {settings_cls.__name__} (RELAYRL_<SERVICE>_<FIELD>); see its module.",
        "additionalProperties": False,
        "properties": {name: _field_schema(props[name]) for name in settable_fields(settings_cls, key)},
    }


def render(schema: dict[str, Any]) -> dict[str, Any]:
    defs = schema.setdefault("$defs", {})
    for key, path in SETTINGS_CLASSES.items():
        defs[f"{key}Settings"] = settings_schema(load_class(path), key)
    return schema


def main() -> int:
    schema = render(json.loads(SCHEMA_PATH.read_text()))
    SCHEMA_PATH.write_text(json.dumps(schema, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
