"""Each rendered settings ConfigMap, plus its container's env, parses with the service's own settings class.

A service silently ignores RELAYRL_* variables it does not know, so the test also requires every
ConfigMap key to name a real field: a misspelled key in a template would otherwise be lost.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic_settings import BaseSettings

from relayrl.config import env_var_name, load_settings
from services.engine.config import EngineSettings
from services.paramsync.config import ParamSyncSettings
from services.queue.config import QueueSettings
from services.rollout.config import RolloutSettings
from services.trainer.config import TrainerSettings
from tests.integration.deploy.chart import CHART, FULLNAME, NAMESPACE, PROFILES, HelmError, Rendered, container, render

# Values the chart gives every service, read unprefixed by those that use them.
SHARED_KEYS = {"RELAYRL_RUN_ID", "RELAYRL_MAX_STALENESS"}

# (settings class, workload kind, workload component, container, ConfigMap component)
SERVICES = [
    (QueueSettings, "Deployment", "queue", "queue", "queue"),
    (ParamSyncSettings, "Deployment", "paramsync", "paramsync", "paramsync"),
    (RolloutSettings, "Deployment", "rollout", "rollout", "rollout"),
    (EngineSettings, "Deployment", "rollout", "engine", "engine"),
    (TrainerSettings, "StatefulSet", "trainer", "trainer", "trainer"),
]


def container_env(rendered: Rendered, kind: str, component: str, name: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The container and the env the kubelet would give it (secrets and pod fields as stand-ins)."""
    spec = container(rendered.pod_spec(kind, component), name)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        configmap = rendered.get("ConfigMap", source["configMapRef"]["name"])
        env.update(configmap["data"])
    for item in spec.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "secretKeyRef" in item["valueFrom"]:
            env[item["name"]] = "from-a-secret"
        else:
            env[item["name"]] = f"{FULLNAME}-{component}-0"
    return spec, env


def parse(settings_cls: type[BaseSettings], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in [n for n in os.environ if n.startswith("RELAYRL_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return load_settings(settings_cls)


def cases() -> list[Any]:
    out = []
    for profile in PROFILES:
        for service in SERVICES:
            engine = service[0] is EngineSettings
            # The built-in engine (and so its settings) exists only in profiles that use it.
            if engine and "cpu" not in profile.stem:
                continue
            out.append(pytest.param(profile, *service, id=f"{profile.stem}-{service[4]}"))
    return out


_rendered: dict[Path, Rendered] = {}


@pytest.mark.parametrize(("profile", "settings_cls", "kind", "component", "name", "configmap"), cases())
def test_settings_configmap_parses_with_the_service_settings(
    profile: Path,
    settings_cls: type[BaseSettings],
    kind: str,
    component: str,
    name: str,
    configmap: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rendered = _rendered.setdefault(profile, render(profile))
    data = rendered.get("ConfigMap", f"{FULLNAME}-{configmap}-settings")["data"]
    known = {env_var_name(settings_cls, field) for field in settings_cls.model_fields}
    assert set(data) - known - SHARED_KEYS == set(), f"keys {settings_cls.__name__} would ignore"

    spec, env = container_env(rendered, kind, component, name)
    settings = parse(settings_cls, env, monkeypatch)

    # The service listens where the pod spec and the Services expect it.
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert settings.host == "0.0.0.0"
    assert settings.http_port == ports["engine" if settings_cls is EngineSettings else "http"]
    if settings_cls is not EngineSettings:
        assert settings.grpc_port == ports["grpc"]
    assert settings.run_id == rendered.get("ConfigMap", f"{FULLNAME}-{configmap}-settings")["data"]["RELAYRL_RUN_ID"]
    # The token arrives from the Secret, never from the ConfigMap (the engine has no control routes).
    expected_token = "" if settings_cls is EngineSettings else "from-a-secret"
    assert settings.api_token.get_secret_value() == expected_token


def test_links_between_services_point_at_the_rendered_services(monkeypatch: pytest.MonkeyPatch) -> None:
    rendered = render(CHART / "ci" / "multinode-values.yaml")
    services = {
        d["metadata"]["name"]: {p["name"]: p["port"] for p in d["spec"]["ports"]} for d in rendered.of_kind("Service")
    }

    def address(service: str) -> str:
        return f"{FULLNAME}-{service}:{services[f'{FULLNAME}-{service}']['grpc']}"

    _, env = container_env(rendered, "StatefulSet", "trainer", "trainer")
    trainer = parse(TrainerSettings, env, monkeypatch)
    assert (trainer.queue_address, trainer.paramsync_address) == (address("queue"), address("paramsync"))
    assert trainer.max_staleness == 2 and trainer.device == "cuda" and trainer.batch_size == 64
    assert str(trainer.model_dir) == "/models/qwen2.5-7b-instruct"

    _, env = container_env(rendered, "Deployment", "rollout", "rollout")
    rollout = parse(RolloutSettings, env, monkeypatch)
    assert (rollout.queue_address, rollout.paramsync_address) == (address("queue"), address("paramsync"))
    assert rollout.engine_url == f"http://127.0.0.1:{services[f'{FULLNAME}-rollout']['engine']}"
    assert rollout.replica_id == f"{FULLNAME}-rollout-0"  # the pod name, per pod

    _, env = container_env(rendered, "Deployment", "paramsync", "paramsync")
    paramsync = parse(ParamSyncSettings, env, monkeypatch)
    assert paramsync.discovery == "kubernetes" and paramsync.k8s_namespace == NAMESPACE
    # Discovery watches exactly the rollout Service's EndpointSlices (the controller labels them so).
    assert paramsync.k8s_label_selector == f"kubernetes.io/service-name={FULLNAME}-rollout"
    assert paramsync.chunk_bytes == 8388608


def test_a_tuple_setting_travels_as_json_and_its_bounds_are_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # adam_betas: a pair in values, a JSON list in the ConfigMap, a tuple in the trainer.
    def values(betas: str) -> Path:
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(f"trainer:\n  settings:\n    adam_betas: {betas}\n")
        return path

    _, env = container_env(render(values("[0.9, 0.95]")), "StatefulSet", "trainer", "trainer")
    assert parse(TrainerSettings, env, monkeypatch).adam_betas == (0.9, 0.95)
    for bad in ("[0.9, 1.0]", "[0.9]"):
        with pytest.raises(HelmError, match="at '/trainer/settings/adam_betas"):
            render(values(bad))
