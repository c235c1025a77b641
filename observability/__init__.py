"""Dashboards and alert rules for RelayRL, kept as code.

``observability/dashboards`` builds the Grafana dashboards with grafana-foundation-sdk
(``make dashboards`` writes them to the chart's ``dashboards/`` folder);
``observability/alerts/relayrl-rules.yaml`` is the Prometheus rules file the chart's
PrometheusRule is rendered from.
"""
