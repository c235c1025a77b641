"""Engine calls lost with the link (a connection reset mid-call, as a network partition does) while
a replica switches weights: the engine must not be left paused, and the announced version must
still load though paramsync announces nothing newer (the trainer waits for this replica's groups).
The health probe must see such a link as down, however busy the client is."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commands.stack.chaos.proxy import FaultyProxy
from relayrl.redis_process import RedisProcess
from relayrl.retry import RetryPolicy
from services.engine.client import EngineClient, EngineLinkError, SamplingParams
from services.paramsync.client import ParamSyncClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from tests.integration.rollout.conftest import EngineProcess, queue_overrides
from tests.integration.rollout.replica_harness import (
    bare_weight_sync,
    new_policy,
    paramsync_service,
    running_replica,
)
from tests.waiting import wait_until_async


class LossyLink(EngineClient):
    """The real client, except that the next calls to the endpoints in ``lose`` are lost: ``"answer"``
    sends the call (the engine acts on it) and then fails as a reset does; ``"request"`` fails before
    sending."""

    def __init__(self, base_url: str, lose: dict[str, list[str]]) -> None:
        super().__init__(base_url, retries=0)
        self.lose = lose

    async def _send_once(self, method: str, path: str, json: Any) -> Any:
        pending = self.lose.get(path)
        if pending:
            if pending.pop(0) == "answer":
                await super()._send_once(method, path, json)
            raise EngineLinkError(f"{path}: connection reset by peer (lost on purpose)")
        return await super()._send_once(method, path, json)


async def _generates(engine_url: str, timeout_s: float = 10.0) -> bool:
    """A request completes within ``timeout_s``: the engine is not paused."""
    async with EngineClient(engine_url, timeout=timeout_s) as client:
        with contextlib.suppress(EngineLinkError):
            out = await client.generate([5, 6, 7], SamplingParams(max_new_tokens=4, ignore_eos=True))
            return len(out[0].output_ids) == 4
    return False


async def test_a_paused_switch_whose_answers_are_lost_leaves_the_engine_generating_at_the_new_version(
    start_engine: Callable[..., EngineProcess], tiny_model_dir: Path, tmp_path: Path
) -> None:
    # in_place mode freezes the running requests around the update: pause, update, continue.
    lose = {
        "/pause_generation": ["answer"],  # the engine paused; the replica never heard so
        "/update_weights_from_disk": ["request"],
        "/continue_generation": ["request", "request"],
    }
    await _switch_through_losses(start_engine(), tiny_model_dir, tmp_path, "in_place", lose)


async def test_a_one_call_switch_whose_answers_are_lost_still_loads_the_version(
    start_engine: Callable[..., EngineProcess], tiny_model_dir: Path, tmp_path: Path
) -> None:
    # abort_resume switches with one update call that aborts and applies; the engine applied the
    # version the first time, so the one sent again must load it again, harmlessly.
    lose = {"/update_weights_from_disk": ["answer", "request"]}
    await _switch_through_losses(start_engine(), tiny_model_dir, tmp_path, "abort_resume", lose)


async def _switch_through_losses(
    engine: EngineProcess, tiny_model_dir: Path, tmp_path: Path, mode: str, lose: dict[str, list[str]]
) -> None:
    async with (
        paramsync_service() as address,
        ParamSyncClient(address) as paramsync,
        LossyLink(engine.url, lose) as link,
    ):
        old = int(await link.weight_version())
        sync, state = bare_weight_sync(paramsync, link, "r-lossy", mode, tmp_path / "weights", old)
        sync.resubscribe = RetryPolicy(attempts=None, first_wait_s=0.2, max_wait_s=30.0)
        syncing = asyncio.create_task(sync.run_forever())
        try:
            await paramsync.publish(old + 1, new_policy(tiny_model_dir, 1.1))
            # One announcement only: the retry comes from re-subscribing, not from a newer version.
            await wait_until_async(lambda: state.held_version == old + 1, timeout_s=30, what="the version loaded")
            assert await link.weight_version() == str(old + 1)
            assert not any(lose.values()), f"every planned loss happened: {lose}"
            assert await _generates(engine.url), "the engine was left paused"
        finally:
            syncing.cancel()
            await asyncio.gather(syncing, return_exceptions=True)


async def test_an_engine_found_paused_after_a_partition_is_told_to_continue(
    start_engine: Callable[..., EngineProcess], redis_server: RedisProcess, run_id: str
) -> None:
    engine = start_engine()
    proxy = FaultyProxy("engine", "127.0.0.1", engine.port)
    port = await proxy.start()
    queue = await start_queue_server(QueueSettings(**queue_overrides(redis_server.url, run_id)))
    try:
        async with (
            EngineClient(engine.url) as direct,
            running_replica(f"http://127.0.0.1:{port}", queue.grpc_address) as replica,
        ):
            await wait_until_async(replica.state.ready, what="engine ready")
            # What a switch cut off mid-way leaves behind when its continue never arrives.
            await direct.pause_generation("abort")
            assert not await _generates(engine.url, timeout_s=2.0)
            partition = asyncio.create_task(proxy.partition(6.0))
            await wait_until_async(lambda: not replica.state.ready(), timeout_s=10, what="replica sees the engine down")
            await partition
            await wait_until_async(replica.state.ready, timeout_s=10, what="replica sees the engine back")
            await wait_until_async(lambda: _generates(engine.url), timeout_s=20, what="the engine generates again")
    finally:
        await proxy.close()
        await queue.stop()


async def test_a_health_probe_cut_off_by_a_partition_reports_the_engine_down(
    start_engine: Callable[..., EngineProcess],
) -> None:
    engine = start_engine()
    proxy = FaultyProxy("engine", "127.0.0.1", engine.port)
    port = await proxy.start()
    try:
        async with EngineClient(f"http://127.0.0.1:{port}") as client:
            assert await client.health()
            partition = asyncio.create_task(proxy.partition(2.0))
            await wait_until_async(lambda: proxy.partitioned, what="the partition")
            # Held by the partition, then cut when it heals; sent again, it would find the engine.
            probe = await client.health()
            await partition
            assert not probe, "a probe whose connection the partition cut reported the engine up"
            assert await client.health()
    finally:
        await proxy.close()


async def test_a_health_probe_does_not_wait_behind_generations_for_a_connection(
    start_engine: Callable[..., EngineProcess],
) -> None:
    engine = start_engine()
    async with EngineClient(engine.url) as direct, EngineClient(engine.url, max_connections=1) as client:
        await direct.pause_generation("in_place")
        # The client's only pooled connection, held by a generate the paused engine keeps waiting.
        held = asyncio.create_task(client.generate([5, 6, 7], SamplingParams(max_new_tokens=4, ignore_eos=True)))

        async def held_in_the_engine() -> bool:
            return not await direct.flush_cache()  # refused while a request waits

        try:
            await wait_until_async(held_in_the_engine, what="the generate waiting in the engine")
            assert await client.health(), "the probe waited for the connection a generate holds"
        finally:
            await direct.continue_generation()
        assert len((await held)[0].output_ids) == 4
