"""Alert rules: ``relayrl-rules.yaml`` is the source, rendered into the chart's PrometheusRule."""
