"""The services around a trainer under test, all real except the rollout.

- the queue service (``start_queue_server``) on a real redis-server, in-process on a real gRPC port;
- paramsync (``build_service``), in-process on a real gRPC port;
- :class:`SyntheticRollout`, which stands in for the rollout service and its engine (a real
  engine would make these tests minutes long): it leases prompts through the real PromptQueue
  at the latest version paramsync holds, makes ``n`` random responses per prompt with fixed
  behaviour log-probs, scores them (share of the digit "1" in the response) and pushes the groups
  through the real TrajectoryQueue, exactly as the rollout service does over gRPC.

Everything runs on one asyncio loop in a background thread, so the test body (and the trainer
subprocesses it starts) stay synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relayrl.schema import Group, Sample
from relayrl.serving import start_grpc_server
from relayrl.subprocesses import Process, start_process
from services.paramsync.client import ParamSyncClient
from services.paramsync.config import ParamSyncSettings
from services.paramsync.server import SERVICE_NAME, build_service
from services.paramsync.service import add_to_server
from services.queue.client import QueueClient
from services.queue.config import QueueSettings
from services.queue.server import start_queue_server

REPO = Path(__file__).resolve().parents[3]
DIGIT_ONE = ord("1") + 3  # byte tokenizer: 3 special tokens, then bytes in order (see relayrl.models.tokenizer)


@dataclass
class SyntheticRollout:
    queue_address: str
    paramsync_address: str
    max_new_tokens: int = 6
    seed: int = 0
    pushed: list[Group] = field(default_factory=list)

    async def run(self) -> None:
        rng = random.Random(self.seed)
        async with QueueClient(self.queue_address) as queue, ParamSyncClient(self.paramsync_address) as ps:
            while True:
                held = (await ps.list_replicas()).latest_version
                batch = await queue.lease_batch("synthetic-0", 8, held, block_timeout_s=0.2)
                leases = batch.leases
                if batch.newer_version_waiting:
                    # As a replica waits for its weights: asking again at once would spin on this
                    # loop, and the trainer under test shares the machine with it.
                    await self._version_after(ps, held, deadline_s=0.2)
                if not leases:
                    continue
                groups = [self._group(lease.prompt, lease.lease_id, held, rng) for lease in leases]
                await queue.push(groups)
                await queue.complete("synthetic-0", [lease.lease_id for lease in leases])
                self.pushed.extend(groups)

    @staticmethod
    async def _version_after(ps: ParamSyncClient, held: int, deadline_s: float) -> None:
        """Returns once paramsync holds a version newer than ``held``, or after ``deadline_s``."""
        deadline = time.monotonic() + deadline_s
        while (await ps.list_replicas()).latest_version <= held and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def _group(self, prompt: Any, lease_id: str, version: int, rng: random.Random) -> Group:
        samples = []
        for _ in range(prompt.n_samples):
            length = rng.randint(1, prompt.max_new_tokens or self.max_new_tokens)
            response = [rng.choice((DIGIT_ONE, DIGIT_ONE + 1, DIGIT_ONE + 2)) for _ in range(length)]
            samples.append(
                Sample(
                    prompt_token_ids=list(prompt.prompt_token_ids),
                    response_token_ids=response,
                    behavior_logprobs=[-1.1] * length,
                    policy_versions=[version] * length,
                    reward=response.count(DIGIT_ONE) / length,
                )
            )
        return Group.answering(prompt, samples, lease_id)


class Stack:
    """Queue + paramsync + synthetic rollout on a background loop; use as a context manager."""

    def __init__(self, redis_url: str, run_id: str) -> None:
        self.redis_url = redis_url
        self.run_id = run_id
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def __enter__(self) -> Stack:
        self._thread.start()
        self.call(self._start())
        return self

    async def _start(self) -> None:
        self.queue = await start_queue_server(
            QueueSettings(
                redis_url=self.redis_url, run_id=self.run_id, consumer_idle_timeout_s=1.0, poll_interval_s=0.02
            )
        )
        self.paramsync = build_service(ParamSyncSettings())
        self.paramsync_server = await start_grpc_server(
            "127.0.0.1", 0, [lambda s: add_to_server(self.paramsync, s)], [SERVICE_NAME]
        )
        self.paramsync_address = f"127.0.0.1:{self.paramsync_server.port}"
        self.rollout = SyntheticRollout(self.queue.grpc_address, self.paramsync_address)
        self.rollout_task = asyncio.create_task(self.rollout.run())

    def __exit__(self, *exc: object) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _stop(self) -> None:
        self.rollout_task.cancel()
        await asyncio.gather(self.rollout_task, return_exceptions=True)
        await self.paramsync_server.stop(0)
        await self.queue.stop()

    def latest_version(self) -> int:
        return self.paramsync.store.latest_version

    def trainer_env(self, model_dir: Path, run_dir: Path, **settings: Any) -> dict[str, str]:
        env = {
            **python_env(),
            "RELAYRL_RUN_ID": self.run_id,
            "RELAYRL_TRAINER_MODEL_DIR": str(model_dir),
            "RELAYRL_TRAINER_RUN_DIR": str(run_dir),
            "RELAYRL_TRAINER_QUEUE_ADDRESS": self.queue.grpc_address,
            "RELAYRL_TRAINER_PARAMSYNC_ADDRESS": self.paramsync_address,
        }
        for key, value in settings.items():
            name = "RELAYRL_MAX_STALENESS" if key == "max_staleness" else f"RELAYRL_TRAINER_{key.upper()}"
            env[name] = str(value)
        return env


def torchrun(nproc: int, module: str, *args: str) -> list[str]:
    """torchrun in standalone mode (it picks a free rendezvous port itself)."""
    return [
        sys.executable,
        "-m",
        "relayrl.torchrun",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]


def _stat(pid: int) -> list[str]:
    # Fields after the command name: [0] state, [1] ppid, ..., [19] start time.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every process below ``pid``; torchrun starts its workers in
    sessions of their own, so signalling torchrun's process group does not reach them."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = _stat(int(entry.name))
                children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def _kill_if_same(pid: int, started: str, sig: int) -> None:
    """Signals ``pid`` only while it is still the process we saw (never a reused pid)."""
    with contextlib.suppress(OSError, IndexError):
        if _stat(pid)[19] == started:
            os.kill(pid, sig)


def stop_group(proc: Process, sig: int = signal.SIGTERM, timeout_s: float = 20) -> None:
    """Stops a job and every process it started; none is left behind."""
    family = descendants(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        if sig == signal.SIGKILL:
            # A crash: every rank dies at once, not an orderly torchrun shutdown.
            for pid, started in family:
                _kill_if_same(pid, started, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)
    for pid, started in family:
        _kill_if_same(pid, started, signal.SIGKILL)


def run_logged(cmd: list[str], log: Path, timeout_s: float = 120) -> str:
    """Runs a job (a torchrun one: every rank is stopped after) to the end with its output in
    ``log``; fails with the log's tail unless it exits 0; returns the log."""
    with log.open("wb") as f:
        proc = start_process(
            cmd, cwd=REPO, env=python_env(), stdout=f, stderr=subprocess.STDOUT, new_session=True, end_with_caller=True
        )
    try:
        assert proc.wait(timeout_s) == 0, log.read_text()[-3000:]
    finally:
        stop_group(proc)
    return log.read_text()


def python_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def start_trainer(env: dict[str, str], log_path: Path, nproc: int = 1) -> Process:
    """A trainer job: one plain process, or ``torchrun`` with ``nproc`` ranks."""
    cmd = [sys.executable, "-m", "services.trainer"] if nproc == 1 else torchrun(nproc, "services.trainer")
    log = log_path.open("ab")
    try:
        return start_process(
            cmd, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, new_session=True, end_with_caller=True
        )
    finally:
        log.close()
