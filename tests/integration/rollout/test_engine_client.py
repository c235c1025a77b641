"""The engine client's link: connections kept open between requests, and every failure an EngineError."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from commands.stack.chaos.proxy import FaultyProxy
from services.engine.client import EngineClient, EngineLinkError, EngineUnavailableError, SamplingParams
from tests.integration.rollout.conftest import EngineProcess
from tests.waiting import wait_until_async


class CountingProxy(FaultyProxy):
    """The chaos proxy, counting the connections it accepts."""

    accepted = 0

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await super()._serve(client_r, client_w)


@pytest.fixture
async def proxy(engine: EngineProcess) -> AsyncIterator[CountingProxy]:
    target = urlsplit(engine.url)
    proxy = CountingProxy("engine", target.hostname or "127.0.0.1", target.port or 80)
    await proxy.start()
    yield proxy
    await proxy.close()


async def test_requests_reuse_the_connections_of_earlier_ones(proxy: CountingProxy) -> None:
    # Agentic episodes send a short request per turn: a connection per request costs the engine
    # an accept and a teardown each time.
    params = SamplingParams(max_new_tokens=2, ignore_eos=True)
    async with EngineClient(f"http://127.0.0.1:{proxy.port}") as client:
        for _ in range(4):
            outs = await asyncio.gather(*(client.generate([5, 6, 7], params) for _ in range(16)))
            assert all(len(out[0].output_ids) == 2 for out in outs)
    assert proxy.accepted <= 16


async def test_an_engine_out_of_reach_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once it is closed
    async with EngineClient(f"http://127.0.0.1:{port}", retries=0) as client:
        with pytest.raises(EngineUnavailableError, match="cannot connect"):
            await client.generate([5, 6, 7], SamplingParams(max_new_tokens=2))
        assert not await client.health()


async def test_a_link_cut_mid_answer_is_an_engine_error(proxy: CountingProxy) -> None:
    async with EngineClient(f"http://127.0.0.1:{proxy.port}", retries=0) as client:
        request = asyncio.ensure_future(client.generate([5, 6, 7], SamplingParams(max_new_tokens=400, ignore_eos=True)))

        async def connected() -> bool:
            return proxy.accepted == 1

        await wait_until_async(connected, 10, "the request to reach the proxy")
        proxy.reset()
        with pytest.raises((EngineUnavailableError, EngineLinkError)):
            await request


async def test_an_answer_later_than_the_timeout_is_a_link_error(proxy: CountingProxy) -> None:
    proxy.latency_s = 1.0
    async with EngineClient(f"http://127.0.0.1:{proxy.port}", timeout=0.3, retries=0) as client:
        with pytest.raises(EngineLinkError, match="link failed"):
            await client.generate([5, 6, 7], SamplingParams(max_new_tokens=2))


async def test_an_engine_behind_a_path_prefix_is_called_under_it() -> None:
    # A gateway that routes /sglang-0/... to an engine: every call must keep the prefix.
    seen: list[str] = []

    async def model_info(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.json_response({"model_path": "m", "weight_version": "7"})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/sglang-0/get_model_info", model_info)
    app.router.add_get("/sglang-0/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with EngineClient(f"http://127.0.0.1:{port}/sglang-0/", retries=0) as client:
            assert await client.health()
            assert await client.weight_version() == "7"
        assert seen == ["/sglang-0/get_model_info"]
    finally:
        await runner.cleanup()
