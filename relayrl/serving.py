"""Hosting a service: its two servers, gRPC (with health and reflection) and HTTP, and its life
until SIGTERM. Every service is hosted the same way::

    async def start_queue_server(settings) -> QueueServer:   # builds the core, then
        servers = await start_servers(settings, app, registrars, SERVICE_NAMES)
        return QueueServer(..., servers)                   # anything with ``async stop()``

    async def serve(settings) -> None:
        await serve_until_signal("queue", lambda: start_queue_server(settings))

:func:`start_servers` binds both servers on the service's ``host``/``grpc_port``/``http_port``;
:meth:`Servers.stop` stops gRPC first (health turns NOT_SERVING, calls in flight get a grace
period), then HTTP. :func:`serve_until_signal` starts the service, waits for SIGINT or SIGTERM and
stops it; the service's own ``stop`` decides what it drains around its servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import uvicorn
from fastapi import FastAPI
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from relayrl.grpc_requests import UndecodableRequests

log = logging.getLogger(__name__)

# Weight chunks and trajectory batches are large; gRPC's 4 MiB default is too small.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

GRPC_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", DEFAULT_MAX_MESSAGE_BYTES),
]

Registrar = Callable[[grpc.aio.Server], None]

HTTP_KEEP_ALIVE_S = 75


@dataclass
class GrpcServer:
    server: grpc.aio.Server
    port: int
    health: health_aio.HealthServicer
    service_names: Sequence[str]

    async def set_serving(self, serving: bool) -> None:
        """Flips the standard health status of every service on this server (and the overall one)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in (*self.service_names, ""):
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_grpc_server(
    host: str,
    port: int,
    registrars: Iterable[Registrar],
    service_names: Sequence[str],
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> GrpcServer:
    """Starts an asyncio gRPC server with the given services, health checking and reflection.

    ``service_names`` are full names (``relayrl.v1.TrajectoryQueue``); each starts SERVING.
    """
    server = grpc.aio.server(
        interceptors=[UndecodableRequests()],
        options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    for register in registrars:
        register(server)
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"gRPC could not bind {host}:{port} (port in use?)")
    await server.start()
    handle = GrpcServer(server=server, port=bound, health=health, service_names=service_names)
    await handle.set_serving(True)
    log.info("gRPC serving %s on %s:%d", ", ".join(service_names), host, bound)
    return handle


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn that leaves signal handling to the service, which owns shutdown of both servers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class HttpServer:
    server: uvicorn.Server
    task: asyncio.Task[None]
    port: int

    async def stop(self) -> None:
        self.server.should_exit = True
        await self.task


async def start_http_server(app: FastAPI, host: str, port: int) -> HttpServer:
    """Serves ``app`` with uvicorn on this loop; port 0 binds a free port, reported back."""
    # IPPROTO_TCP, not the default 0: asyncio turns TCP_NODELAY on only for sockets whose proto
    # says TCP, and without it a response's headers and body (two writes) wait out the client's
    # delayed ACK, ~40 ms per request.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    # Idle connections outlive the clients' own keep-alive (httpx: 5 s), so a client never
    # reuses a connection the server is closing at that moment (a ReadError mid-request).
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", access_log=False, timeout_keep_alive=HTTP_KEEP_ALIVE_S
    )
    server = _EmbeddedUvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    log.info("HTTP serving on %s:%d", host, bound)
    return HttpServer(server=server, task=task, port=bound)


async def wait_for_shutdown_signal() -> signal.Signals:
    """Returns when the process receives SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda s=sig: received.done() or received.set_result(s))
    sig = await received
    log.info("received %s, shutting down", sig.name)
    return sig


@dataclass
class Servers:
    """A service's HTTP server and, where it has gRPC services, its gRPC server."""

    http: HttpServer
    grpc: GrpcServer | None = None

    async def stop(self, grpc_grace_s: float = 5.0) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace_s=grpc_grace_s)
        await self.http.stop()


class HostSettings(Protocol):
    host: str
    grpc_port: int
    http_port: int


async def start_servers(
    settings: HostSettings,
    app: FastAPI,
    registrars: Sequence[Registrar] = (),
    service_names: Sequence[str] = (),
    grpc_health_only: bool = False,
) -> Servers:
    """HTTP with ``app`` and gRPC with ``registrars``' services (SERVING); a service with no gRPC
    services of its own gets gRPC anyway with ``grpc_health_only`` (health checks for its probes)."""
    with_grpc = bool(registrars) or grpc_health_only
    grpc_server = (
        await start_grpc_server(settings.host, settings.grpc_port, registrars, service_names) if with_grpc else None
    )
    try:
        http = await start_http_server(app, settings.host, settings.http_port)
    except BaseException:
        # A taken HTTP port must not leave the gRPC server holding its port in this process.
        if grpc_server is not None:
            await grpc_server.stop(grace_s=0)
        raise
    return Servers(http=http, grpc=grpc_server)


class Running(Protocol):
    async def stop(self) -> None: ...


@contextlib.contextmanager
def uncollected_start() -> Iterator[None]:
    """A service's start-up (its imports, its model, its servers) with the cyclic garbage collector
    off; afterwards, everything it built is left out of every later collection (``gc.freeze``).

    Importing torch and transformers and loading a model create millions of objects that live as
    long as the process. The collector scans them again and again while they pile up, for no
    garbage: about 1 s of an engine's 4.5 s start on a 2-core machine. Inside another use it does
    nothing, so a command can cover its imports and :func:`serve_until_signal` its ``start``.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def exit_uncollected() -> None:
    """Lets a stopped service's process exit without a last collection of its whole heap (over 1 s
    once torch is loaded; the operating system takes the memory back anyway). Objects built after
    this call are still collected: only what exists now is left out."""
    gc.freeze()


async def serve_until_signal(name: str, start: Callable[[], Awaitable[Running]]) -> None:
    """Starts the service, runs it until SIGINT or SIGTERM, then stops it, whatever ended the wait."""
    with uncollected_start():
        running = await start()
    log.info("%s started; stops on SIGTERM or SIGINT", name)
    try:
        await wait_for_shutdown_signal()
    finally:
        await running.stop()
        exit_uncollected()


def grpc_channel(address: str) -> grpc.aio.Channel:
    """An asyncio channel to another RelayRL service with large-message limits."""
    return grpc.aio.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS)
