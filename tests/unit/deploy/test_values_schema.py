"""The chart's values.schema.json lists exactly the fields of each service's settings class."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
GENERATOR = REPO / "deploy" / "helm" / "settings_schema.py"


def generator():
    spec = importlib.util.spec_from_file_location("settings_schema", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_schema_matches_the_settings_classes() -> None:
    gen = generator()
    committed = json.loads(gen.SCHEMA_PATH.read_text())
    fresh = gen.render(json.loads(gen.SCHEMA_PATH.read_text()))
    assert committed == fresh, "values.schema.json is stale: run .venv/bin/python deploy/helm/settings_schema.py"


def test_schema_leaves_out_secrets_shared_values_and_chart_owned_ports() -> None:
    defs = json.loads(generator().SCHEMA_PATH.read_text())["$defs"]
    for name, schema in defs.items():
        fields = set(schema["properties"])
        assert schema["additionalProperties"] is False
        assert not fields & {"api_token", "redis_password", "host", "grpc_port", "http_port"}, name
        assert not fields & {"run_id", "max_staleness", "redis_url"}, name
    assert "replica_id" not in defs["rolloutSettings"]["properties"]  # set per pod from its name
    lr = defs["trainerSettings"]["properties"]["lr"]
    assert lr["type"] == "number" and lr["exclusiveMinimum"] == 0 and lr["description"]
    assert defs["paramsyncSettings"]["properties"]["transport"]["pattern"] == "^(grpc|disk|distributed)$"
