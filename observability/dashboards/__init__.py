"""RelayRL's Grafana dashboards, built with grafana-foundation-sdk.

Each dashboard module (overview, rollout, trainer, queue, paramsync) has a ``build()``;
``common`` holds the board and panel builders and ``promql`` the queries they share.
:data:`observability.build.DASHBOARDS` lists the builders, and ``make dashboards``
(``python -m observability.build``) writes their JSON into ``deploy/helm/relayrl/dashboards/``.
"""
