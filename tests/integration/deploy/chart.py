"""Rendering the chart with the real Helm binary (installed by `make setup` into .venv/bin/helm)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "deploy" / "helm" / "relayrl"
HELM = REPO / ".venv" / "bin" / "helm"
PROFILES = sorted(CHART.glob("ci/*-values.yaml"))
RELEASE = "rl"
NAMESPACE = "relayrl"
FULLNAME = "rl-relayrl"
# The Prometheus Operator CRDs, as `helm install` sees them on a cluster that has them.
MONITORING_APIS = tuple(
    f"monitoring.coreos.com/v1/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
)


class HelmError(RuntimeError):
    pass


def helm(*args: str) -> str:
    if not HELM.exists():
        raise HelmError(f"{HELM} is missing: run `make setup` (scripts/install-helm.sh installs it)")
    done = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise HelmError(done.stderr.strip() or done.stdout.strip())
    return done.stdout


@dataclass
class Rendered:
    docs: list[dict[str, Any]]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for doc in self.docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
        raise KeyError(f"no {kind} {name}; have {[(d['kind'], d['metadata']['name']) for d in self.docs]}")

    def pod_spec(self, kind: str, component: str) -> dict[str, Any]:
        return self.get(kind, f"{FULLNAME}-{component}")["spec"]["template"]["spec"]


def render(*values_files: Path, sets: tuple[str, ...] = (), api_versions: tuple[str, ...] = ()) -> Rendered:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--include-crds"]
    for path in values_files:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    for api in api_versions:
        args += ["--api-versions", api]
    return Rendered([doc for doc in yaml.safe_load_all(helm(*args)) if doc])


def container(pod_spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec["containers"] if c["name"] == name)
