"""What paramsync knows of a rollout replica (:class:`ReplicaEndpoint`) and what a discovery
backend must do (:class:`ReplicaDiscovery`); every backend and transport builds on these."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ReplicaEndpoint:
    """One rollout replica: its stable id and the base URL of its engine's HTTP API."""

    replica_id: str
    engine_url: str = ""


@runtime_checkable
class ReplicaDiscovery(Protocol):
    def watch(self) -> AsyncIterator[frozenset[ReplicaEndpoint]]:
        """Yields the full replica set now and after every change; runs until cancelled."""
        ...
