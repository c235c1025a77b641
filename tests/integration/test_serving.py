"""The gRPC and HTTP server helpers every service uses, against real sockets."""

import socket
import subprocess
import sys

import grpc
import pytest
from fastapi import APIRouter
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from relayrl import http_client
from relayrl.http_app import create_http_app
from relayrl.metrics import ServiceMetrics
from relayrl.serving import start_grpc_server, start_http_server, start_servers
from relayrl.v1 import rollout_pb2, rollout_pb2_grpc


class _Control(rollout_pb2_grpc.RolloutControlServicer):
    async def Status(self, request, context):
        return rollout_pb2.RolloutStatus(replica_id="r0", weight_version=3)


async def test_grpc_server_serves_health_reflection_and_the_service():
    server = await start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: rollout_pb2_grpc.add_RolloutControlServicer_to_server(_Control(), s)],
        ["relayrl.v1.RolloutControl"],
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="relayrl.v1.RolloutControl"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

            await server.set_serving(False)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING

            reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
            responses = reflect.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            names = {s.name async for r in responses for s in r.list_services_response.service}
            assert "relayrl.v1.RolloutControl" in names and "grpc.health.v1.Health" in names

            status = await rollout_pb2_grpc.RolloutControlStub(channel).Status(rollout_pb2.StatusRequest())
            assert status.weight_version == 3

            # Unimplemented methods answer with a gRPC status, not a hang.
            try:
                await rollout_pb2_grpc.RolloutControlStub(channel).Pause(rollout_pb2.PauseRequest())
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNIMPLEMENTED
            else:
                raise AssertionError("Pause should be unimplemented")
    finally:
        await server.stop(0)


async def test_http_app_probes_metrics_and_bearer_auth():
    metrics = ServiceMetrics("demo")
    requests = metrics.counter("requests", "Requests served.", unit="total")
    requests.inc(3)
    ready = {"value": False}
    control = APIRouter()

    @control.post("/pause")
    async def pause() -> dict[str, bool]:
        return {"paused": True}

    @control.post("/scale")
    async def scale(replicas: int) -> dict[str, int]:
        if replicas < 1:
            raise ValueError("replicas must be >= 1")
        return {"replicas": replicas}

    app = create_http_app("demo", metrics, lambda: ready["value"], SecretStr("tok"), [control])
    server = await start_http_server(app, "127.0.0.1", 0)
    try:
        async with http_client.async_client(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/healthz")).json()["status"] == "ok"
            assert (await client.get("/readyz")).status_code == 503
            ready["value"] = True
            assert (await client.get("/readyz")).status_code == 200

            body = (await client.get("/metrics")).text
            assert "relayrl_demo_requests_total 3.0" in body

            missing = await client.post("/control/pause")
            assert missing.status_code == 401 and "bearer token" in missing.json()["detail"]
            wrong = await client.post("/control/pause", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid bearer token"
            ok = await client.post("/control/pause", headers={"Authorization": "Bearer tok"})
            assert ok.json() == {"paused": True}

            auth = {"Authorization": "Bearer tok"}
            bad = await client.post("/control/scale", params={"replicas": 0}, headers=auth)
            assert bad.status_code == 400 and "replicas must be" in bad.json()["detail"]
            garbage = await client.post("/control/scale", params={"replicas": "many"}, headers=auth)
            assert garbage.status_code == 422
    finally:
        await server.stop()


async def test_every_accepted_http_connection_sends_without_nagle():
    # A response is two writes (headers, body); on a socket without TCP_NODELAY the body waits for
    # the client's delayed ACK, ~40 ms on Linux, so every lone request to every service (a reward
    # score, a control call) would take at least that long.
    app = create_http_app("demo", ServiceMetrics("demo"), lambda: True, SecretStr("tok"))
    server = await start_http_server(app, "127.0.0.1", 0)
    try:
        async with http_client.async_client(base_url=f"http://127.0.0.1:{server.port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            connections = list(server.server.server_state.connections)
            assert connections, "the kept-alive connection is not among the server's"
            for conn in connections:
                sock = conn.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await server.stop()


def test_cli_help_lists_commands_without_loading_torch():
    # Help is fast because it loads neither torch nor transformers (seconds each); checked by what
    # the process imported rather than by a wall-clock bound, which a loaded machine breaks.
    code = (
        "import runpy, sys\n"
        "sys.argv = ['relayrl', '--help']\n"
        "try:\n"
        "    runpy.run_module('commands.cli', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('loaded:', 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert "model" in out
    assert out.strip().endswith("loaded: False False")


class _Ports:
    host = "127.0.0.1"

    def __init__(self, grpc_port: int, http_port: int) -> None:
        self.grpc_port = grpc_port
        self.http_port = http_port


def _app():
    return create_http_app("test", ServiceMetrics("test"), lambda: True, SecretStr(""))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_servers_stop_grpc_then_http_and_free_both_ports():
    registrars = [lambda s: rollout_pb2_grpc.add_RolloutControlServicer_to_server(_Control(), s)]
    servers = await start_servers(_Ports(0, 0), _app(), registrars, ["relayrl.v1.RolloutControl"])
    assert servers.grpc is not None
    grpc_port, http_port = servers.grpc.port, servers.http.port
    async with http_client.async_client() as client:
        assert (await client.get(f"http://127.0.0.1:{http_port}/healthz")).status_code == 200
    await servers.stop(grpc_grace_s=0.1)
    assert _bindable(grpc_port) and _bindable(http_port)


async def test_a_taken_http_port_fails_the_start_and_releases_the_grpc_port():
    grpc_port = _free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        registrars = [lambda s: rollout_pb2_grpc.add_RolloutControlServicer_to_server(_Control(), s)]
        with pytest.raises(OSError):
            await start_servers(
                _Ports(grpc_port, taken.getsockname()[1]), _app(), registrars, ["relayrl.v1.RolloutControl"]
            )
    assert _bindable(grpc_port)
