"""A fault-injecting TCP proxy on loopback, one per component that others connect to.

Clients reach redis, the queue, paramsync and each engine through their proxy (the stack's
``route`` hook hands out the proxy's address), so the chaos run can, for a while, delay every
chunk (``latency``), reset every open connection (``reset``: RST, as a crashed peer or a
flapping link does), or cut the component off (``partition``: open connections are reset and
new ones hang, unanswered, until the partition heals). The proxy itself never fails: its port
stays the same while the component behind it restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
CHUNK = 64 * 1024
NETWORK_FAULTS = ("latency", "reset", "partition")


def _abort(writer: asyncio.StreamWriter) -> None:
    """Closes with a TCP RST (SO_LINGER 0), not an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultyProxy:
    def __init__(self, name: str, target_host: str, target_port: int) -> None:
        self.name = name
        self.target = (target_host, target_port)
        self.port = 0
        self.latency_s = 0.0
        self._healed = asyncio.Event()
        self._healed.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listens on ``host:port`` (0: any free port) and returns the port."""
        self._server = await asyncio.start_server(self._serve, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()

    def reset(self) -> None:
        for writer in list(self._writers):
            _abort(writer)
        self._writers.clear()

    @property
    def partitioned(self) -> bool:
        """True while a partition holds: new connections hang until it heals."""
        return not self._healed.is_set()

    async def partition(self, seconds: float) -> None:
        self._healed.clear()
        self.reset()
        await asyncio.sleep(seconds)
        self._healed.set()

    async def slow(self, latency_s: float, seconds: float) -> None:
        self.latency_s = latency_s
        await asyncio.sleep(seconds)
        self.latency_s = 0.0

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            if not self._healed.is_set():
                await self._healed.wait()  # a partition: the connection hangs, then is cut
                _abort(client_w)
                return
            try:
                up_r, up_w = await asyncio.open_connection(*self.target)
            except OSError:
                _abort(client_w)  # the component is down: refuse as it would
                return
            self._writers.add(up_w)
            await asyncio.gather(self._pipe(client_r, up_w), self._pipe(up_r, client_w))
        finally:
            self._writers.discard(client_w)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(CHUNK):
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
                if not self._healed.is_set():
                    return
                dst.write(data)
                await dst.drain()
            if dst.can_write_eof():
                dst.write_eof()
        except (ConnectionError, OSError):
            _abort(dst)
        finally:
            self._writers.discard(dst)


class ProxyFleet:
    """The proxies of one stack, served by their own event loop on a background thread."""

    def __init__(self) -> None:
        self.proxies: dict[str, FaultyProxy] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxies", daemon=True)
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def add(self, name: str, address: str) -> str:
        """Starts a proxy for ``name`` at ``address`` (host:port); returns the proxy's host:port."""
        if name not in self.proxies:
            host, _, port = address.rpartition(":")
            proxy = FaultyProxy(name, host, int(port))
            self._call(proxy.start())
            self.proxies[name] = proxy
        return f"127.0.0.1:{self.proxies[name].port}"

    def inject(self, name: str, kind: str, seconds: float, latency_s: float = 0.0) -> Future[None]:
        proxy = self.proxies[name]
        if kind == "latency":
            coro = proxy.slow(latency_s, seconds)
        elif kind == "partition":
            coro = proxy.partition(seconds)
        elif kind == "reset":
            coro = self._reset(proxy)
        else:
            raise ValueError(f"unknown network fault {kind!r}; expected one of {', '.join(NETWORK_FAULTS)}")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @staticmethod
    async def _reset(proxy: FaultyProxy) -> None:
        proxy.reset()

    def close(self) -> None:
        for proxy in self.proxies.values():
            with contextlib.suppress(Exception):
                self._call(proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
