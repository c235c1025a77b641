"""Replica discovery: where paramsync learns which rollout replicas exist, and the static backend.

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
  watches EndpointSlices (it and this module import nothing of each other); each ready endpoint
  is one replica, ``replica_id`` the pod name and
  ``engine_url`` ``http://<address>:<engine port>``. Selected with ``RELAYRL_PARAMSYNC_DISCOVERY=kubernetes``
  (:func:`services.paramsync.server.create_discovery` picks the backend).

``watch()`` must not return while paramsync runs (it is cancelled at shutdown), and should
retry its own transient failures rather than raise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

from services.paramsync.endpoints import ReplicaEndpoint


class StaticDiscovery:
    """A fixed replica set, yielded once."""

    def __init__(self, replicas: Mapping[str, str]) -> None:
        self._replicas = frozenset(ReplicaEndpoint(rid, url) for rid, url in replicas.items())

    async def watch(self) -> AsyncIterator[frozenset[ReplicaEndpoint]]:
        yield self._replicas
        await asyncio.Event().wait()
