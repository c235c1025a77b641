"""Replica discovery: where paramsync learns which rollout replicas exist.

A discovery source is anything with an async ``watch()`` that yields the *complete* current
set of replicas each time it changes (the first item is the initial set). Paramsync diffs
consecutive sets against its version table: a replica that appears gets a row (and, with a
push transport, is sent the latest version at once); a replica that disappears leaves the table
and its Prometheus series. Replicas that subscribe over gRPC join the table on their own, so a
discovery source is optional on the grpc and disk transports and required for ``distributed``
(paramsync must know every engine to build the broadcast group).

Implementations:

- :class:`StaticDiscovery`: a fixed list from ``RELAYRL_PARAMSYNC_STATIC_REPLICAS``.
- ``services.paramsync.discovery_k8s.KubernetesDiscovery(namespace: str, label_selector: str)``:
  watches EndpointSlices; each ready endpoint is one replica, ``replica_id`` the pod name and
  ``engine_url`` ``http://<address>:<engine port>``. Selected with ``RELAYRL_PARAMSYNC_DISCOVERY=kubernetes``.

``watch()`` must not return while paramsync runs (it is cancelled at shutdown), and should
retry its own transient failures rather than raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from services.paramsync.config import ParamSyncSettings
from services.paramsync.endpoints import ReplicaDiscovery, ReplicaEndpoint


class StaticDiscovery:
    """A fixed replica set, yielded once."""

    def __init__(self, replicas: Mapping[str, str]) -> None:
        self._replicas = frozenset(ReplicaEndpoint(rid, url) for rid, url in replicas.items())

    async def watch(self) -> AsyncIterator[frozenset[ReplicaEndpoint]]:
        yield self._replicas
        await asyncio.Event().wait()


def create_discovery(settings: ParamSyncSettings) -> ReplicaDiscovery:
    """The discovery backend ``RELAYRL_PARAMSYNC_DISCOVERY`` names: static or kubernetes."""
    if settings.discovery == "kubernetes":
        # Imported only here: the kubernetes client is heavy and only this backend needs it.
        from services.paramsync.discovery_k8s import KubernetesDiscovery

        return KubernetesDiscovery(namespace=settings.k8s_namespace, label_selector=settings.k8s_label_selector)
    return StaticDiscovery(settings.replica_endpoints())
