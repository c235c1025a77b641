"""Running the whole local stack (redis, queue, paramsync, engine, rollout, torchrun trainer) in a test."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from commands.stack.config import StackConfig, StackSettings
from commands.stack.launch import LocalStack, prepare_model
from commands.stack.report import read_metrics
from commands.stack.supervisor import supervised
from relayrl import http_client
from services.queue.keys import Keys
from tests.processes import process_alive
from tests.waiting import wait_until

TOKEN = "e2e-token"


def small_run(runs_dir: Path, model_dir: Path, max_staleness: int, total_steps: int, **trainer: Any) -> StackConfig:
    """A short GRPO run of the tiny model on copy_bits, sized for CI's two cores."""
    return StackConfig(
        stack=StackSettings(
            run_id=f"eta{max_staleness}",
            runs_dir=runs_dir,
            model_dir=model_dir,
            max_staleness=max_staleness,
            api_token=TOKEN,
            ready_timeout_s=120,
        ),
        trainer={
            "dataset": "builtin:copy_bits",
            "dataset_difficulty": 1,
            "n_samples": 4,
            "batch_size": 4,
            "max_new_tokens": 3,
            "total_steps": total_steps,
            "save_freq": 2,
            "lr": 0.003,
            **trainer,
        },
        rollout={"max_inflight_prompts": 8, "max_new_tokens": 3},
    )


@contextmanager
def running_stack(config: StackConfig, training: bool = True) -> Iterator[LocalStack]:
    """The whole stack; ``training=False`` leaves the trainer to ``stack.start_training(prepare_model(stack))``."""
    with supervised(None, config.stack.restart_policy()) as supervisor:
        stack = LocalStack(config, supervisor)
        stack.start(prepare_model(stack), training=training)
        yield stack
    for component in supervisor.components:
        assert component.process is not None
        assert not process_alive(component.process.pid), f"{component.name} outlived the stack"


def wait_for_trainer(stack: LocalStack, timeout_s: float) -> int:
    """The trainer's exit code once it exits; any other component that fails meanwhile raises ComponentError."""

    def trainer_exited() -> bool:
        stack.supervisor.check_alive(exited_ok=["trainer"])
        return stack.trainer_exit_code() is not None

    wait_until(trainer_exited, timeout_s, "the trainer to exit", poll_s=0.5)
    code = stack.trainer_exit_code()
    assert code is not None
    return code


def stall_report(stack: LocalStack) -> str:
    """Where a run that stopped moving stands: the prompt queue's state in Redis (waiting with their
    min_start_version, leased with expiry and owner, counters), the trainer's and the rollouts'
    status, and the last lines of every log. For
    the message of a test whose run did not finish on a CI machine, where nothing else survives."""
    keys = Keys(stack.run_id)
    lines = [f"at {time.time():.1f}"]
    try:
        client = redis.Redis.from_url(stack.endpoints.redis_url, decode_responses=True, socket_timeout=5)
        lines.append(f"waiting {client.zrange(keys.prompts_waiting, 0, -1, withscores=True)}")
        lines.append(f"leased {client.zrange(keys.prompts_leased, 0, -1, withscores=True)}")
        lines.append(f"owners {client.hgetall(keys.prompt_owner)}")
        lines.append(f"prompt stats {client.hgetall(keys.prompt_stats)}")
        lines.append(f"queue stats {client.hgetall(keys.stats)}")
    except redis.RedisError as exc:
        lines.append(f"redis unreadable: {exc}")
    # The trainer's released count and step, each rollout's held version and leases.
    auth = {"Authorization": f"Bearer {stack.api_token}"}
    for url in filter(None, [stack.endpoints.trainer_http, *stack.endpoints.rollouts_http]):
        try:
            answer = http_client.get(f"{url}/control/status", headers=auth, timeout=5)
            lines.append(f"{url} status {answer.text}")
        except httpx.HTTPError as exc:
            lines.append(f"{url} status unreadable: {exc!r}")
    lines.extend(log_tails(stack.run_dir, 20))
    return "\n".join(lines)


def log_tails(run_dir: Path, count: int) -> list[str]:
    """The last ``count`` lines of each service log of a run, each log under its name."""
    lines = []
    for log in sorted((run_dir / "logs").glob("*.log")):
        lines.append(f"--- {log.name}")
        lines.extend(log.read_text(errors="replace").splitlines()[-count:])
    return lines


def training_rows(stack: LocalStack) -> list[dict[str, Any]]:
    return [r for r in read_metrics(stack.run_dir / "metrics.jsonl") if "trainer/global_steps" in r]


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    return tmp_path / "runs"
