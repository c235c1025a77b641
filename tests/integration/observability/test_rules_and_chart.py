"""The alert rules pass promtool and fire on what they name; the chart ships the rules and the dashboards."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from observability.alerts.chart import RULES_FILE
from observability.build import CHART_DIR

HERE = Path(__file__).resolve().parent
HELM = CHART_DIR.parents[2] / ".venv" / "bin" / "helm"
PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"


def _promtool(*args: str, cwd: Path = HERE) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: `make setup` installs Debian's prometheus package, which ships it")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def _helm_template(*extra: str) -> list[dict]:
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: run `make setup`")
    done = subprocess.run(
        [str(HELM), "template", "rl", str(CHART_DIR), "--set", "model.source=tiny", *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_promtool_checks_the_rules_file() -> None:
    done = _promtool("check", "rules", str(RULES_FILE))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_alerts_fire_on_what_they_name() -> None:
    done = _promtool("test", "rules", "alerts_test.yaml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_chart_ships_the_rules_file_as_a_prometheus_rule(tmp_path: Path) -> None:
    docs = _helm_template(
        "--set", "monitoring.enabled=true",
        "--set", "monitoring.additionalLabels.release=kube-prometheus-stack",
        "--api-versions", PROMETHEUS_RULE_API,
    )  # fmt: skip
    rules = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert len(rules) == 1
    rule = rules[0]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # Helm passed Prometheus' own {{ $labels.x }} templates through untouched.
    assert rule["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    extracted = tmp_path / "from-chart.yaml"
    extracted.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = _promtool("check", "rules", str(extracted))
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_prometheus_rule_without_monitoring_or_without_the_crd() -> None:
    off = _helm_template("--api-versions", PROMETHEUS_RULE_API)
    no_crd = _helm_template("--set", "monitoring.enabled=true")
    assert not [d for d in off + no_crd if d["kind"] == "PrometheusRule"]


def test_chart_ships_every_dashboard_in_a_configmap_for_the_grafana_sidecar() -> None:
    docs = _helm_template("--set", "dashboards.enabled=true")
    shipped = {}
    for doc in docs:
        if doc["kind"] == "ConfigMap" and doc["metadata"]["labels"].get("grafana_dashboard") == "1":
            shipped.update(doc["data"])
    committed = {path.name: path.read_text() for path in (CHART_DIR / "dashboards").glob("*.json")}
    assert set(shipped) == set(committed)
    for name, text in committed.items():
        assert json.loads(shipped[name]) == json.loads(text), name
