"""RelayRL's Grafana dashboards, built with grafana-foundation-sdk.

Each module builds one dashboard; :data:`observability.dashboards.generate.DASHBOARDS` lists
them and ``make dashboards`` writes their JSON into ``deploy/helm/relayrl/dashboards/``.
"""
