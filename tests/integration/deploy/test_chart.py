"""The Helm chart, rendered by the real Helm for every CI profile and validated offline.

Kubernetes objects are checked with kubernetes-validate (strict: unknown fields fail) at the
oldest Kubernetes the chart supports and the newest schema set shipped; Prometheus Operator
objects against JSON schemas of the CRD fields the chart uses (crd_schemas/).
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest

from tests.integration.deploy.chart import (
    CHART,
    FULLNAME,
    MONITORING_APIS,
    PROFILES,
    HelmError,
    Rendered,
    container,
    helm,
    render,
)

KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")
CRD_SCHEMAS = {
    "ServiceMonitor": Path(__file__).parent / "crd_schemas" / "servicemonitor.json",
    "PodMonitor": Path(__file__).parent / "crd_schemas" / "podmonitor.json",
    "PrometheusRule": Path(__file__).parent / "crd_schemas" / "prometheusrule.json",
}
DEFAULT_PROFILE = CHART / "ci" / "default-values.yaml"
CPU_PROFILE = CHART / "ci" / "cpu-values.yaml"


@functools.cache
def rendered(profile: Path) -> Rendered:
    # Rendered as on a cluster with the Prometheus Operator, so the monitors are validated too.
    return render(profile, api_versions=MONITORING_APIS)


@functools.cache
def rendered_defaults() -> Rendered:
    return render()


def test_every_profile_is_there() -> None:
    names = {p.name for p in PROFILES}
    assert {"default-values.yaml", "multinode-values.yaml", "monitoring-values.yaml"} <= names
    assert {"external-redis-values.yaml", "cpu-values.yaml"} <= names


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_helm_lint(profile: Path) -> None:
    output = helm("lint", "--strict", str(CHART), "-f", str(profile))
    assert "0 chart(s) failed" in output


@pytest.mark.parametrize("profile", [None, *PROFILES], ids=lambda p: p.stem if p else "chart-defaults")
def test_rendered_objects_pass_strict_kubernetes_schemas(profile: Path | None) -> None:
    docs = rendered(profile).docs if profile else render(api_versions=MONITORING_APIS).docs
    assert len(docs) > 10
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            jsonschema.validate(doc, json.loads(CRD_SCHEMAS[doc["kind"]].read_text()))
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{profile}: {doc['kind']}/{doc['metadata']['name']} invalid at {version}: {exc}")


def test_strict_validation_catches_a_misplaced_field() -> None:
    # The same check on a broken object fails, so a pass above means something.
    deployment = rendered(DEFAULT_PROFILE).get("Deployment", f"{FULLNAME}-queue")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_monitoring_profile_renders_a_monitor_per_service_and_for_the_engines() -> None:
    monitoring = rendered(CHART / "ci" / "monitoring-values.yaml")
    monitors = {d["metadata"]["name"]: d for d in monitoring.of_kind("ServiceMonitor")}
    assert set(monitors) == {f"{FULLNAME}-{c}" for c in ("queue", "paramsync", "rollout", "trainer")}
    (engines,) = monitoring.of_kind("PodMonitor")
    assert engines["spec"]["podMetricsEndpoints"][0]["port"] == "engine"
    for monitor in [*monitors.values(), engines]:
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # additionalLabels
    # Only trainer pod 0 (global rank 0) serves /metrics.
    (relabel,) = monitors[f"{FULLNAME}-trainer"]["spec"]["endpoints"][0]["relabelings"]
    assert relabel["action"] == "keep" and relabel["regex"] == "0"


def test_monitors_are_skipped_on_a_cluster_without_the_crds() -> None:
    without = render(CHART / "ci" / "monitoring-values.yaml")
    assert without.of_kind("ServiceMonitor") == [] and without.of_kind("PodMonitor") == []
    assert render().of_kind("ServiceMonitor") == []  # off by default, even with the CRDs


def test_default_values_give_rollout_pods_gpus_shm_and_sglang_probes() -> None:
    spec = rendered_defaults().pod_spec("Deployment", "rollout")
    engine = container(spec, "engine")
    assert engine["image"].startswith("lmsysorg/sglang:v")
    assert engine["command"] == ["python3", "-m", "sglang.launch_server"]
    assert "--enable-metrics" in engine["args"]
    assert "--tp-size=1" in engine["args"] and "--model-path=/models/policy" in engine["args"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    startup = engine["startupProbe"]
    assert startup["httpGet"]["path"] == "/health_generate"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60  # big models load slowly
    assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
    assert_shm(spec, engine)
    # The rollout service shares the weights volume with the engine (disk weight updates).
    rollout = container(spec, "rollout")
    assert rollout["command"] == ["relayrl", "rollout", "serve"]
    assert {m["name"] for m in rollout["volumeMounts"]} >= {"weights"}
    assert {m["name"] for m in engine["volumeMounts"]} >= {"weights", "model"}
    assert rollout["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert rollout["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_default_values_give_trainer_pods_gpus_shm_and_a_torchrun_rendezvous() -> None:
    defaults = rendered_defaults()
    statefulset = defaults.get("StatefulSet", f"{FULLNAME}-trainer")
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    spec = statefulset["spec"]["template"]["spec"]
    trainer = container(spec, "trainer")
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert_shm(spec, trainer)
    command = trainer["command"]
    assert command[0] == "torchrun" and command[-4:] == ["--no-python", "relayrl", "trainer", "run"]
    assert "--nproc-per-node=8" in command and "--node-rank=$(NODE_RANK)" in command
    assert f"--master-addr={FULLNAME}-trainer-0.{FULLNAME}-trainer" in command
    node_rank = next(e for e in trainer["env"] if e["name"] == "NODE_RANK")
    assert node_rank["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    headless = defaults.get("Service", f"{FULLNAME}-trainer")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert statefulset["spec"]["serviceName"] == headless["metadata"]["name"]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert {m["mountPath"] for m in trainer["volumeMounts"]} >= {"/checkpoints"} and claim["metadata"]["name"]


def test_multinode_profile_scales_trainer_nodes_and_engine_tensor_parallelism() -> None:
    multi = rendered(CHART / "ci" / "multinode-values.yaml")
    statefulset = multi.get("StatefulSet", f"{FULLNAME}-trainer")
    assert statefulset["spec"]["replicas"] == 4
    assert "--nnodes=4" in container(statefulset["spec"]["template"]["spec"], "trainer")["command"]
    engine = container(multi.pod_spec("Deployment", "rollout"), "engine")
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 2 and "--tp-size=2" in engine["args"]


def assert_shm(spec: dict, main: dict) -> None:
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in main["volumeMounts"]


def test_cpu_profile_runs_everything_without_gpus() -> None:
    cpu = rendered(CPU_PROFILE)
    text = json.dumps(cpu.docs)
    assert "nvidia.com/gpu" not in text and "sglang" not in text
    spec = cpu.pod_spec("Deployment", "rollout")
    assert container(spec, "engine")["command"] == ["relayrl", "engine", "serve"]
    assert spec["initContainers"][0]["command"][:3] == ["relayrl", "model", "init-tiny"]
    trainer = container(cpu.pod_spec("StatefulSet", "trainer"), "trainer")
    assert "--nproc-per-node=2" in trainer["command"]
    assert cpu.get("ConfigMap", f"{FULLNAME}-trainer-settings")["data"]["RELAYRL_TRAINER_DEVICE"] == "cpu"


def test_redis_is_durable_and_refuses_to_evict() -> None:
    defaults = rendered_defaults()
    conf = defaults.get("ConfigMap", f"{FULLNAME}-redis-config")["data"]["redis.conf"].splitlines()
    assert {"appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction"} <= set(conf)
    statefulset = defaults.get("StatefulSet", f"{FULLNAME}-redis")
    redis = container(statefulset["spec"]["template"]["spec"], "redis")
    assert redis["image"].startswith("redis:7.")
    assert redis["livenessProbe"]["exec"]["command"][0] == "redis-cli"
    assert statefulset["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


def test_external_redis_profile_uses_the_given_host_and_secret() -> None:
    external = rendered(CHART / "ci" / "external-redis-values.yaml")
    assert not [d for d in external.docs if d["metadata"]["name"].startswith(f"{FULLNAME}-redis")]
    queue = external.get("ConfigMap", f"{FULLNAME}-queue-settings")["data"]
    assert queue["RELAYRL_REDIS_URL"] == "rediss://redis.example.internal:6380/2"
    env = container(external.pod_spec("Deployment", "queue"), "queue")["env"]
    password = next(e for e in env if e["name"] == "RELAYRL_QUEUE_REDIS_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "managed-redis", "key": "password"}
    assert external.of_kind("Secret") == []  # both secrets are the user's own


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_no_secret_value_in_any_configmap(profile: Path) -> None:
    docs = render(
        profile, sets=("auth.apiToken=tok-3f9a1c", "redis.auth.password=pw-77d2e0", "externalRedis.password=pw-77d2e0")
    ).docs
    secrets = [
        base64.b64decode(value).decode()
        for doc in docs
        if doc["kind"] == "Secret"
        for value in doc.get("data", {}).values()
    ]
    configmaps = [d for d in docs if d["kind"] == "ConfigMap"]
    text = json.dumps(configmaps)
    for secret in secrets:
        assert secret not in text
    for key in (k for cm in configmaps for k in cm.get("data", {})):
        assert not key.endswith(("API_TOKEN", "PASSWORD", "SECRET")), key
    if "external" not in profile.stem:
        assert "tok-3f9a1c" in secrets  # the sentinels did reach the Secrets


def test_containers_run_as_non_root_with_read_only_roots() -> None:
    for doc in rendered_defaults().docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = doc["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            # SGLang JIT-compiles into its own image; everything of ours has a read-only root.
            if not c["image"].startswith("lmsysorg/sglang"):
                assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]


def test_only_paramsync_can_read_the_kubernetes_api() -> None:
    defaults = rendered_defaults()
    (role,) = defaults.of_kind("Role")
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = defaults.of_kind("RoleBinding")
    assert binding["subjects"][0]["name"] == f"{FULLNAME}-paramsync"
    for doc in defaults.of_kind("Deployment") + defaults.of_kind("StatefulSet"):
        spec = doc["spec"]["template"]["spec"]
        mounts_token = spec.get("automountServiceAccountToken", True)
        assert mounts_token == (doc["metadata"]["name"] == f"{FULLNAME}-paramsync"), doc["metadata"]["name"]


def test_selectors_carry_no_version_labels() -> None:
    # Selectors are immutable: a label that changes between releases would break `helm upgrade`.
    for doc in rendered_defaults().docs:
        selector = doc.get("spec", {}).get("selector", {})
        labels = selector.get("matchLabels", selector if doc["kind"] == "Service" else {})
        assert not {"helm.sh/chart", "app.kubernetes.io/version"} & set(labels), doc["metadata"]["name"]


def test_helm_test_hook_checks_every_service() -> None:
    (pod,) = [d for d in rendered_defaults().of_kind("Pod") if d["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    urls = [a for a in pod["spec"]["containers"][0]["command"] if a.startswith("http://")]
    assert sorted(u.split("/")[2].split(":")[0] for u in urls) == sorted(
        [
            f"{FULLNAME}-paramsync",
            f"{FULLNAME}-queue",
            f"{FULLNAME}-rollout",
            f"{FULLNAME}-trainer-0.{FULLNAME}-trainer",
        ]
    )
    assert all(u.endswith("/readyz") for u in urls)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("queue.replcas=2", "at '/queue': additional properties 'replcas' not allowed"),
        ("trainer.settings.learning_rate=0.1", "at '/trainer/settings': additional properties 'learning_rate'"),
        ("trainer.settings.adv_estimator=ppo", "at '/trainer/settings/adv_estimator': value must be one of"),
        ("rollout.engine.type=vllm", "at '/rollout/engine/type': value must be one of 'sglang', 'builtin'"),
        ("queue.settings.api_token=x", "additional properties 'api_token' not allowed"),
    ],
)
def test_a_typo_in_values_is_rejected_with_a_clear_message(setting: str, message: str) -> None:
    with pytest.raises(HelmError) as failure:
        render(sets=(setting,))
    assert message in str(failure.value)
    assert "values don't meet the specifications of the schema" in str(failure.value)


def test_dashboards_switch_ships_each_dashboard_file_to_the_grafana_sidecar() -> None:
    files = sorted((CHART / "dashboards").glob("*.json"))
    assert not [d for d in render().of_kind("ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    shipped = [
        d
        for d in render(sets=("dashboards.enabled=true",)).of_kind("ConfigMap")
        if "-dashboard-" in d["metadata"]["name"]
    ]
    assert len(shipped) == len(files)
    for dashboard in shipped:
        assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((name, body),) = dashboard["data"].items()
        assert json.loads(body) == json.loads((CHART / "dashboards" / name).read_text())


def test_clusters_older_than_1_28_are_refused() -> None:
    # The trainer's node rank comes from the pod-index label, which 1.28 introduced.
    with pytest.raises(HelmError, match=r"chart requires kubeVersion: >=1.28.0-0"):
        helm("template", "rl", str(CHART), "--kube-version", "1.27.0")
    assert helm("template", "rl", str(CHART), "--kube-version", "1.28.0")


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


def _probe_budget_s(probe: dict) -> int:
    return probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3) + probe.get("initialDelaySeconds", 0)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_restarts_and_probes_agree_a_slow_start_is_never_killed_in_a_loop(profile: Path) -> None:
    """The local stack's restart rule in Kubernetes terms: a dead container is restarted
    (restartPolicy Always), liveness only asks "is the process alive" (/healthz or the engine's
    /health, never /readyz, which fails while a dependency is down and would restart the healthy
    side of a partition), and a container with liveness has a startupProbe at least as patient,
    so a slow (re)start after a crash is not killed before it could come up."""
    checked = 0
    for doc in render(profile).docs:
        if doc["kind"] not in WORKLOADS:
            continue
        spec = doc["spec"]["template"]["spec"]
        assert spec.get("restartPolicy", "Always") == "Always", doc["metadata"]["name"]
        for c in spec["containers"]:
            where = f"{doc['metadata']['name']}/{c['name']}"
            if "livenessProbe" not in c:
                continue
            checked += 1
            liveness = c["livenessProbe"]
            assert liveness.get("httpGet", {}).get("path") != "/readyz", f"{where}: liveness on /readyz"
            assert "startupProbe" in c, f"{where}: liveness without a startupProbe"
            assert _probe_budget_s(c["startupProbe"]) >= _probe_budget_s(liveness), where
            if "readinessProbe" in c:
                assert c["readinessProbe"] != liveness, f"{where}: readiness and liveness are the same check"
    assert checked >= 3
