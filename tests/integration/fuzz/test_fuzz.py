"""A fixed-seed, small `relayrl fuzz` run against the real services, and the bugs it found."""

from __future__ import annotations

import grpc
import pytest

from commands.fuzz.run import fuzz
from relayrl.redis_process import RedisProcess
from relayrl.serving import grpc_channel
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server

pytestmark = pytest.mark.fuzz


def test_small_fuzz_run_finds_no_crash_hang_unexplained_error_or_lost_work():
    result = fuzz(calls=200, services=("queue", "paramsync", "rollout", "engine"), seed=7)
    for kind in ("grpc", "rest"):
        for name, tally in result[kind].items():
            assert tally["calls"] > 0, (kind, name)
            assert tally["crashes"] == tally["hangs"] == tally["unexplained_errors"] == tally["lost"] == 0, (
                kind,
                name,
                tally["examples"],
            )
    assert result["ok"]
    assert sum(t["calls"] for t in result["grpc"].values()) == 3 * 200


async def test_undecodable_grpc_request_gets_invalid_argument(redis_server: RedisProcess) -> None:
    # Found by `relayrl fuzz`: bytes that are not a protobuf message got UNKNOWN, with no reason.
    server = await start_queue_server(QueueSettings(redis_url=redis_server.url, run_id="undecodable"))
    try:
        async with grpc_channel(server.grpc_address) as channel:
            stats = channel.unary_unary("/relayrl.v1.TrajectoryQueue/Stats")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stats(b"\xff\xff\xff", timeout=10)
    finally:
        await server.stop()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not decode" in err.value.details()
