"""Kubernetes replica discovery against a stand-in API server speaking the real list/watch JSON."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import kubernetes_validate
import pytest
from kubernetes import client

from services.paramsync.discovery_k8s import KubernetesDiscovery
from services.paramsync.endpoints import ReplicaEndpoint
from tests.integration.deploy._fakes import FakeKubeAPI, endpoint_slice

SERVICE = "rl-relayrl-rollout"
SELECTOR = f"kubernetes.io/service-name={SERVICE}"


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    server = FakeKubeAPI(namespace="rl").start()
    yield server
    server.stop()


def discovery(api: FakeKubeAPI, **kwargs: object) -> KubernetesDiscovery:
    configuration = client.Configuration(host=api.url)
    return KubernetesDiscovery("rl", SELECTOR, api_client=client.ApiClient(configuration), retry_delay_s=0.1, **kwargs)


async def next_set(updates: AsyncIterator[frozenset[ReplicaEndpoint]]) -> dict[str, str]:
    replicas = await asyncio.wait_for(anext(updates), timeout=10)
    return {r.replica_id: r.engine_url for r in replicas}


def test_fake_objects_are_valid_endpointslices() -> None:
    obj = endpoint_slice("s", SERVICE, {"pod-a": "10.0.0.1"}, namespace="rl", not_ready=frozenset({"pod-a"}))
    kubernetes_validate.validate(obj, "1.28.0", strict=True)


async def test_lists_ready_endpoints_then_follows_adds_and_removals(api: FakeKubeAPI) -> None:
    api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.5"}, namespace="rl"))
    api.put(endpoint_slice("other", "someone-else", {"x-0": "10.9.9.9"}, namespace="rl"))
    async with contextlib.aclosing(discovery(api).watch()) as updates:
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.5:30000"}

        # A scaled-up replica starts not ready, so it is not a replica yet...
        pods = {"rollout-0": "10.0.0.5", "rollout-1": "10.0.0.6"}
        api.put(endpoint_slice("rollout-a", SERVICE, pods, namespace="rl", not_ready=frozenset({"rollout-1"})))
        api.put(endpoint_slice("rollout-a", SERVICE, pods, namespace="rl"))
        # ...and joins once ready (the not-ready step changed nothing, so nothing was yielded for it).
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.5:30000", "rollout-1": "http://10.0.0.6:30000"}

        # Changes to other Services' slices reach the client only as bookmarks: no new set.
        api.put(endpoint_slice("other", "someone-else", {"x-0": "10.9.9.9", "x-1": "10.9.9.8"}, namespace="rl"))
        api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-1": "10.0.0.6"}, namespace="rl"))
        assert await next_set(updates) == {"rollout-1": "http://10.0.0.6:30000"}

        api.delete("rollout-a")
        assert await next_set(updates) == {}


async def test_resumes_from_last_resource_version_after_the_watch_times_out(api: FakeKubeAPI) -> None:
    api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.5"}, namespace="rl"))
    async with contextlib.aclosing(discovery(api, watch_timeout_s=1).watch()) as updates:
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.5:30000"}
        version = api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.7"}, namespace="rl"))
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.7:30000"}
        while api.watchers() < 3:  # let the 1 s watch expire twice
            await asyncio.sleep(0.1)
        api.put(
            endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.7", "rollout-1": "10.0.0.8"}, namespace="rl")
        )
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.7:30000", "rollout-1": "http://10.0.0.8:30000"}
        watches = [q for q in api.requests if q.get("watch") == ["true"]]
        # Each re-watch starts from the last version seen, never from scratch (no missed or replayed events).
        assert all(int(q["resourceVersion"][0]) >= version for q in watches[1:])
        lists = [q for q in api.requests if q.get("watch") != ["true"]]
        assert len(lists) == 1


async def test_relists_when_history_is_compacted(api: FakeKubeAPI) -> None:
    api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.5"}, namespace="rl"))
    async with contextlib.aclosing(discovery(api, watch_timeout_s=1).watch()) as updates:
        assert await next_set(updates) == {"rollout-0": "http://10.0.0.5:30000"}
        api.compact()  # the next re-watch from our old version is answered with 410 Gone
        while sum(1 for q in api.requests if q.get("watch") != ["true"]) < 2:
            await asyncio.sleep(0.1)
        api.put(endpoint_slice("rollout-a", SERVICE, {"rollout-2": "10.0.0.9"}, namespace="rl"))
        assert await next_set(updates) == {"rollout-2": "http://10.0.0.9:30000"}


async def test_survives_an_api_server_outage() -> None:
    first = FakeKubeAPI(namespace="rl").start()
    first.put(endpoint_slice("rollout-a", SERVICE, {"rollout-0": "10.0.0.5"}, namespace="rl"))
    second = None
    try:
        async with contextlib.aclosing(discovery(first).watch()) as updates:
            assert await next_set(updates) == {"rollout-0": "http://10.0.0.5:30000"}
            first.stop()
            await asyncio.sleep(0.5)  # discovery retries against a closed port meanwhile
            # The API server comes back (same address) with state that moved on while it was away.
            second = FakeKubeAPI(namespace="rl", port=first.port)
            second.put(endpoint_slice("rollout-b", SERVICE, {"rollout-3": "10.0.1.3"}, namespace="rl"))
            second.start()
            assert await next_set(updates) == {"rollout-3": "http://10.0.1.3:30000"}
    finally:
        if second is not None:
            second.stop()
