"""``relayrl ctl`` against real servers: the trainer's own control routes behind a real bearer
token, the queue service on a real redis-server, paramsync's gRPC service, and a port where
nothing listens. The whole-stack check (every component, rollout included) is in
test_prometheus_stack.py."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pydantic import SecretStr

from commands.ctl.components import paramsync_status
from commands.ctl.config import CtlSettings, env_file_text
from commands.ctl.deployment import act, gather_status
from relayrl.http_app import create_http_app
from relayrl.net import free_port
from relayrl.redis_process import RedisProcess
from relayrl.serving import start_grpc_server, start_http_server
from services.paramsync.config import ParamSyncSettings
from services.paramsync.server import SERVICE_NAME, build_service
from services.paramsync.service import add_to_server
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server
from services.trainer.control import Control, control_router
from services.trainer.status import TrainerStatus

REPO = Path(__file__).resolve().parents[3]
TOKEN = "ctl-test-token"
T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a thread, so the servers run while the test calls them synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


@dataclass
class Deployment:
    trainer_url: str
    queue_address: str
    paramsync_address: str
    control: Control

    def settings(self, token: str = TOKEN, **overrides: Any) -> CtlSettings:
        values = {
            "trainer_url": self.trainer_url,
            "queue_address": self.queue_address,
            "paramsync_address": self.paramsync_address,
            "api_token": SecretStr(token),
            "timeout_s": 3.0,
            **overrides,
        }
        return CtlSettings(**values)

    def env(self, token: str = TOKEN, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("RELAYRL_")}
        return {
            **base,
            "RELAYRL_API_TOKEN": token,
            "RELAYRL_CTL_TRAINER_URL": self.trainer_url,
            "RELAYRL_CTL_QUEUE_ADDRESS": self.queue_address,
            "RELAYRL_CTL_PARAMSYNC_ADDRESS": self.paramsync_address,
            "RELAYRL_CTL_TIMEOUT_S": "3",
            **extra,
        }


def _trainer_status(control: Control) -> TrainerStatus:
    return TrainerStatus(
        step=7,
        version=3,
        total_steps=20,
        consuming=control.consuming.is_set(),
        checkpoint_requested=control.checkpoint_requested.is_set(),
        buffered_groups=2,
        unacked_groups=1,
        released_prompts=12,
        param_sync_count=3,
        world_size=2,
    )


@pytest.fixture
def deployment(redis_server: RedisProcess, tmp_path: Path) -> Iterator[Deployment]:
    loop = LoopThread()
    control = Control()
    token = SecretStr(TOKEN)
    trainer_app = create_http_app(
        "trainer", _metrics(), lambda: True, token, [control_router(control, lambda: _trainer_status(control))]
    )
    trainer_http = loop.run(start_http_server(trainer_app, "127.0.0.1", 0))
    queue = loop.run(
        start_queue_server(QueueSettings(redis_url=redis_server.url, run_id="ctl", api_token=token, capacity=64))
    )
    paramsync = build_service(ParamSyncSettings(api_token=token))
    paramsync_grpc = loop.run(
        start_grpc_server("127.0.0.1", 0, [lambda s: add_to_server(paramsync, s)], [SERVICE_NAME])
    )
    try:
        yield Deployment(
            f"http://127.0.0.1:{trainer_http.port}", queue.grpc_address, f"127.0.0.1:{paramsync_grpc.port}", control
        )
    finally:
        loop.run(paramsync_grpc.stop(grace_s=0.5))
        loop.run(queue.stop())
        loop.run(trainer_http.stop())
        loop.close()


def _metrics():
    from relayrl.metrics import ServiceMetrics

    return ServiceMetrics("trainer")


def _ctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "commands.cli", "ctl", *args],
        cwd=REPO,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_reads_trainer_queue_and_paramsync(deployment: Deployment) -> None:
    status = gather_status(deployment.settings(), ["trainer", "queue", "paramsync"])
    assert status.failures == [] and status.not_configured == []
    assert status.trainer is not None and (status.trainer.step, status.trainer.version) == (7, 3)
    assert status.queue is not None and status.queue.capacity == 64 and status.queue.queue_size == 0
    assert status.paramsync is not None and status.paramsync.latest_version == 0


def test_pause_resume_and_checkpoint_flip_the_trainers_flags(deployment: Deployment) -> None:
    settings = deployment.settings()
    (paused,) = act(settings, "pause", ["trainer"])
    assert paused.ok and not deployment.control.consuming.is_set()
    assert "stopped consuming" in paused.message
    (resumed,) = act(settings, "resume", ["trainer"])
    assert resumed.ok and deployment.control.consuming.is_set()
    (checkpoint,) = act(settings, "checkpoint", ["trainer"])
    assert checkpoint.ok and deployment.control.checkpoint_requested.is_set()


def test_cli_status_prints_every_configured_component(deployment: Deployment) -> None:
    done = _ctl("status", "--all", env=deployment.env())
    # rollout is not configured here, so the command reports it and exits 1.
    assert done.returncode == 1, done.stderr
    out = done.stdout
    assert "trainer step 7/20 at v3 (consuming)" in out
    assert "queue 0 queued + 0 pending / 64" in out
    assert "policy v0" in out
    assert "set RELAYRL_CTL_ROLLOUT_URLS" in out
    assert "Traceback" not in out + done.stderr

    as_json = _ctl("status", "--service", "queue", "--json", env=deployment.env())
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["queue"]["capacity"] == 64


def test_cli_pause_with_a_wrong_token_says_401_and_names_the_endpoint(deployment: Deployment) -> None:
    done = _ctl("pause", "--service", "trainer", env=deployment.env(token="wrong"))
    assert done.returncode == 1
    text = " ".join((done.stdout + done.stderr).split())
    assert f"POST {deployment.trainer_url}/control/pause" in text
    assert "401 Unauthorized: the API token was refused" in text
    assert "RELAYRL_API_TOKEN" in text
    assert "Traceback" not in text
    assert deployment.control.consuming.is_set(), "a refused pause must not pause"


def test_cli_without_a_token_says_it_is_missing(deployment: Deployment) -> None:
    done = _ctl("checkpoint", env=deployment.env(token=""))
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1 and "401 Unauthorized: missing API token" in text


def test_unreachable_endpoints_are_named_with_the_cause(deployment: Deployment) -> None:
    dead_http, dead_grpc = free_port(), free_port()
    env = deployment.env(
        RELAYRL_CTL_TRAINER_URL=f"http://127.0.0.1:{dead_http}",
        RELAYRL_CTL_PARAMSYNC_ADDRESS=f"127.0.0.1:{dead_grpc}",
        RELAYRL_CTL_TIMEOUT_S="1",
    )
    done = _ctl("status", "--all", env=env)
    text = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1
    assert f"GET http://127.0.0.1:{dead_http}/control/status: unreachable (connection refused)" in text
    assert f"gRPC 127.0.0.1:{dead_grpc} ParamSync.ListReplicas: unreachable (connection refused" in text
    # The queue still answered: one dead component does not hide the others.
    assert "queue 0 queued" in text
    assert "Traceback" not in text


def test_a_component_that_comes_up_within_the_timeout_is_reached(deployment: Deployment) -> None:
    # A restarting component (a rollout, a chaos fault) refuses connections for a moment: the
    # call waits for it within its bound instead of failing at once.
    port = free_port()
    loop = LoopThread()
    paramsync = build_service(ParamSyncSettings(api_token=SecretStr(TOKEN)))
    servers = []
    starter = threading.Timer(
        1.0,
        lambda: servers.append(
            loop.run(start_grpc_server("127.0.0.1", port, [lambda s: add_to_server(paramsync, s)], [SERVICE_NAME]))
        ),
    )
    starter.start()
    try:
        report = paramsync_status(f"127.0.0.1:{port}", timeout_s=20.0)
        assert report.latest_version == 0 and report.replicas == []
    finally:
        starter.join()
        for server in servers:
            loop.run(server.stop(grace_s=0.5))
        loop.close()


# A process making calls to paramsync one after another. Each Ctrl-C ends a round: the channels
# that round left behind are finalised, and the calls start again.
_CALL_ROUNDS = """
import gc, signal, sys
from commands.ctl.components import paramsync_status
# As `relayrl up` does: a process started in the background inherits SIGINT ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
for round in range(int(sys.argv[2])):
    try:
        calls = 0
        while True:
            paramsync_status(sys.argv[1], 5.0)
            calls += 1
            if calls == 2:
                print("calling", flush=True)
    except KeyboardInterrupt:
        pass
    gc.collect()
    print("stopped", flush=True)
"""


def test_ctrl_c_during_grpc_calls_leaves_a_process_that_goes_on_and_exits(deployment: Deployment) -> None:
    # gRPC's readiness future made closing a channel wait about 0.2 s for a polling thread, so a
    # Ctrl-C nearly always landed in that wait. It left the channel half closed, and finalising it
    # blocked the process for good: `relayrl up --keep-alive` hung after Ctrl-C.
    rounds = 8
    caller = subprocess.Popen(
        [sys.executable, "-c", _CALL_ROUNDS, deployment.paramsync_address, str(rounds)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert caller.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line.strip()) for line in caller.stdout], daemon=True).start()
    seen: list[str] = []

    def expect(line: str) -> None:
        try:
            seen.append(lines.get(timeout=30))
        except queue.Empty:
            caller.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack, for the reader
            caller.wait(timeout=30)
            rest = [lines.get() for _ in range(lines.qsize())]
            raise AssertionError(f"no {line!r} within 30 s; the process said {seen}, then {rest}") from None
        assert seen[-1] == line, seen

    try:
        for _ in range(rounds):
            expect("calling")
            caller.send_signal(signal.SIGINT)
            expect("stopped")
        assert caller.wait(timeout=30) == 0, seen
    finally:
        if caller.poll() is None:
            caller.kill()


def test_bad_arguments_and_settings_get_a_message_not_a_traceback(deployment: Deployment) -> None:
    both = _ctl("pause", "--service", "trainer", "--all", env=deployment.env())
    assert both.returncode == 2 and "either --service NAME or --all" in both.stderr
    wrong = _ctl("resume", "--service", "queue", env=deployment.env())
    assert wrong.returncode == 2 and "expected one of rollout, trainer" in wrong.stderr
    bad_url = _ctl("status", env=deployment.env(RELAYRL_CTL_TRAINER_URL="localhost:8080"))
    assert bad_url.returncode == 2 and "RELAYRL_CTL_TRAINER_URL" in bad_url.stderr
    for done in (both, wrong, bad_url):
        assert "Traceback" not in done.stdout + done.stderr


def test_cli_reads_endpoints_and_token_from_an_env_file(deployment: Deployment, tmp_path: Path) -> None:
    env_file = tmp_path / "ctl.env"
    env_file.write_text(
        env_file_text(TOKEN, [], deployment.trainer_url, deployment.queue_address, deployment.paramsync_address)
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RELAYRL_")}
    done = _ctl("--env-file", str(env_file), "status", "--service", "trainer", env=clean)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trainer step 7/20" in done.stdout
    missing = _ctl("--env-file", str(tmp_path / "nope.env"), "status", env=clean)
    assert missing.returncode == 2 and "no such file" in missing.stderr
