"""Renders the rules file into the chart's PrometheusRule template.

Helm cannot read files outside the chart, so the template carries a copy of the rules. The
copy is generated (``make dashboards``) and a test keeps it equal to the source. Prometheus'
own ``{{ $labels.x }}`` templates are wrapped as Go raw strings so Helm passes them through.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

RULES_FILE = Path(__file__).resolve().parent / "relayrl-rules.yaml"

_PROMETHEUS_TEMPLATE = re.compile(r"\{\{.*?\}\}")

_HEADER = """\
{{- /*
Generated from observability/alerts/relayrl-rules.yaml by `make dashboards`; edit the source, not this file.
Rendered only when monitoring is on AND the cluster serves the PrometheusRule CRD.
*/ -}}
{{- if and .Values.monitoring.enabled (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1/PrometheusRule") }}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ include "relayrl.fullname" . }}
  labels:
    {{- include "relayrl.labels" (dict "root" . "component" "alerts") | nindent 4 }}
    {{- with .Values.monitoring.additionalLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
"""


def _escape_for_helm(text: str) -> str:
    if "`" in text:
        raise ValueError("alert rules must not contain backticks: they delimit Helm raw strings")
    return _PROMETHEUS_TEMPLATE.sub(lambda m: "{{`" + m.group(0) + "`}}", text)


def rules_spec(rules_file: Path = RULES_FILE) -> str:
    """The rules file from its ``groups:`` key on, verbatim (comments kept), after checking it parses."""
    text = rules_file.read_text()
    if not isinstance(yaml.safe_load(text).get("groups"), list):
        raise ValueError(f"{rules_file}: expected a top-level 'groups' list")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("groups:"))
    return "\n".join(lines[start:]) + "\n"


def render_template(rules_file: Path = RULES_FILE) -> str:
    body = "".join(f"  {line}\n" if line else "\n" for line in rules_spec(rules_file).splitlines())
    return _HEADER + _escape_for_helm(body) + "{{- end }}\n"
