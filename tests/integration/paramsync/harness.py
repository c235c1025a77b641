"""Running paramsync for tests: in-process on a real gRPC server, or as a `relayrl paramsync serve` process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from relayrl.net import free_port, wait_for_port
from relayrl.serving import start_grpc_server
from relayrl.subprocesses import stop_process
from relayrl.v1 import paramsync_pb2 as pb
from services.paramsync.channels.dataplane import frame, recv_frame
from services.paramsync.channels.tcp import DataPlaneServer
from services.paramsync.config import ParamSyncSettings
from services.paramsync.core import ParamSyncCore
from services.paramsync.manifest import Manifest
from services.paramsync.server import build_service, create_discovery
from services.paramsync.service import SERVICE_NAME, add_to_server

REPO = Path(__file__).resolve().parents[3]


@contextlib.asynccontextmanager
async def running_service(port: int = 0, **overrides: object) -> AsyncIterator[tuple[str, ParamSyncCore]]:
    """The service with its background tasks and data plane on this loop, its gRPC port ``port`` (0:
    any free one); yields (address, service)."""
    settings = ParamSyncSettings(**overrides)
    service = build_service(settings)
    service.restore_from_disk()
    tasks = [
        asyncio.create_task(service.run_deliveries()),
        asyncio.create_task(service.watch_discovery(create_discovery(settings))),
        asyncio.create_task(service.watch_deadlines(0.1)),
    ]
    server = await start_grpc_server("127.0.0.1", port, [lambda s: add_to_server(service, s)], [SERVICE_NAME])
    data_plane = DataPlaneServer(service, settings.forward_streams)
    if settings.data_plane:
        await data_plane.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.port}", service
    finally:
        await server.stop(0)
        await data_plane.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def python_env(**env: str) -> dict[str, str]:
    merged = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    return merged


@contextlib.contextmanager
def serve_process(tmp_path: Path, **env: str) -> Iterator[tuple[str, int, subprocess.Popen[bytes]]]:
    """`relayrl paramsync serve` as a child process; yields (grpc address, http port, process)."""
    grpc_port, http_port = free_port(), free_port()
    log = open(tmp_path / f"paramsync-{grpc_port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "commands.cli", "paramsync", "serve"],
        env=python_env(RELAYRL_PARAMSYNC_GRPC_PORT=str(grpc_port), RELAYRL_PARAMSYNC_HTTP_PORT=str(http_port), **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    try:
        wait_for_port("127.0.0.1", http_port, 30)
        wait_for_port("127.0.0.1", grpc_port, 30)
        yield f"127.0.0.1:{grpc_port}", http_port, proc
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 10) -> None:
    stop_process(proc, timeout_s)


def send_one_run(data_port: int, manifest: Manifest, run: pb.TensorChecksums) -> pb.BulkReply:
    """Opens an upload of ``manifest`` on paramsync's data plane, sends ``run`` as its first run
    and returns paramsync's answer to it (blocking: call it in a thread)."""
    with socket.create_connection(("127.0.0.1", data_port), timeout=10) as sock:
        sock.sendall(frame(pb.BulkRequest(publish=manifest.to_proto())))
        assert recv_frame(sock, pb.BulkReply).code == 0
        sock.sendall(frame(run))
        return recv_frame(sock, pb.BulkReply)
