"""Discovery feeds the version table: replicas that appear get rows, replicas that leave lose them."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.paramsync.config import ParamSyncSettings
from services.paramsync.discovery import StaticDiscovery
from services.paramsync.endpoints import ReplicaDiscovery, ReplicaEndpoint
from services.paramsync.server import build_service


class ScriptedDiscovery:
    """A discovery source that yields the given sets one after another, then waits."""

    def __init__(self, *sets: frozenset[ReplicaEndpoint]) -> None:
        self.sets = sets

    async def watch(self) -> AsyncIterator[frozenset[ReplicaEndpoint]]:
        for replica_set in self.sets:
            yield replica_set
            await asyncio.sleep(0)
        await asyncio.Event().wait()


async def test_replicas_join_and_leave_the_table_as_discovery_reports_them():
    a, b, c = (ReplicaEndpoint(n, f"http://{n}:30000") for n in "abc")
    source = ScriptedDiscovery(frozenset({a, b}), frozenset({b, c}))
    assert isinstance(source, ReplicaDiscovery) and isinstance(StaticDiscovery({}), ReplicaDiscovery)
    service = build_service(ParamSyncSettings())
    task = asyncio.create_task(service.watch_discovery(source))
    try:
        for _ in range(10):
            await asyncio.sleep(0)
        rows = {r.replica_id: r.engine_url for r in service.table.snapshot()}
        assert rows == {"b": "http://b:30000", "c": "http://c:30000"}
        metrics = service.metrics.service.render()[0].decode()
        assert 'replica="a"' not in metrics and 'relayrl_paramsync_replica_version{replica="c"} 0.0' in metrics
    finally:
        task.cancel()


async def test_static_discovery_yields_the_configured_replicas_once():
    settings = ParamSyncSettings(static_replicas="r0=http://e0:1,r1=http://e1:1")
    source = StaticDiscovery(settings.replica_endpoints())
    stream = aiter(source.watch())
    assert await anext(stream) == {ReplicaEndpoint("r0", "http://e0:1"), ReplicaEndpoint("r1", "http://e1:1")}
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), 0.05)
