"""Fixtures of the reward service tests: real ``relayrl reward serve`` processes on a tiny reward model."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from relayrl.net import free_port
from relayrl.subprocesses import ProcessExited, stop_process
from services.reward.launch import launch_reward, wait_reward_ready

REPO = Path(__file__).resolve().parents[3]


@dataclass
class RewardProcess:
    """``relayrl reward serve`` in a subprocess on ``port`` with ``RELAYRL_REWARD_*`` from ``env``."""

    model_dir: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90.0) -> RewardProcess:
        env = {"RELAYRL_REWARD_TORCH_THREADS": "1", "OMP_NUM_THREADS": "1", **self.env}
        self.process = launch_reward(self.model_dir, self.port, env, stderr=subprocess.PIPE, cwd=REPO)
        try:
            wait_reward_ready(self.process, self.url, timeout_s)
        except ProcessExited as exc:
            raise RuntimeError(f"reward exited: {self.process.stderr.read().decode()[-2000:]}") from exc  # type: ignore[union-attr]
        except TimeoutError:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            if self.process.stderr is not None:
                self.process.stderr.close()


@pytest.fixture(scope="session")
def tiny_rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny one-label reward model (``relayrl model init-tiny --preset tiny-rm``), read-only for tests."""
    from relayrl.models.tiny import init_tiny, preset_spec

    return init_tiny(tmp_path_factory.mktemp("tiny-rm"), preset_spec("tiny-rm"))


@pytest.fixture
def start_reward(tiny_rm_dir: Path) -> Iterator[Callable[..., RewardProcess]]:
    """Starts reward processes (on the tiny reward model unless told otherwise); stops them afterwards."""
    started: list[RewardProcess] = []

    def start(port: int | None = None, model_dir: Path | None = None, **settings: str) -> RewardProcess:
        env = {f"RELAYRL_REWARD_{k.upper()}": v for k, v in settings.items()}
        proc = RewardProcess(model_dir or tiny_rm_dir, port or free_port(), env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
