"""Fixtures of the rollout and engine integration tests: real engine processes, a real queue service."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from relayrl.net import free_port
from relayrl.subprocesses import Process, ProcessExited, stop_process
from services.engine.launch import launch_engine, wait_engine_healthy

HERE = Path(__file__).parent
REPO = HERE.parents[2]


@dataclass
class EngineProcess:
    """``relayrl engine serve`` in a subprocess on a free port; ``settings`` adds ``RELAYRL_ENGINE_*``
    variables (the CUDA engine's, in tests/gpu)."""

    model_dir: Path
    port: int
    settings: dict[str, str] = field(default_factory=dict)
    process: Process | None = None
    log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> EngineProcess:
        # A file, not a pipe: nobody reads the engine's log while it serves, and a full pipe blocks it.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the engine runs; closed by stop)
        self.process = launch_engine(self.model_dir, self.port, stderr=self.log, cwd=REPO, settings=self.settings)
        try:
            wait_engine_healthy(self.process, self.url, timeout_s)
        except ProcessExited as exc:
            raise RuntimeError(f"engine exited: {self.log_tail()}") from exc
        except TimeoutError:
            self.stop()
            raise
        return self

    def log_tail(self, size: int = 2000) -> str:
        if self.log is None:
            return ""
        self.log.seek(0)
        return self.log.read()[-size:].decode(errors="replace")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
        if self.log is not None:
            # Shown with a failing test's captured output: the engine's own account.
            if tail := self.log_tail(3000):
                print(f"the engine's log (last lines):\n{tail}")
            self.log.close()
            self.log = None


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path) -> Iterator[EngineProcess]:
    """One engine process shared by the rollout tests (starting one costs seconds on a busy CPU).

    Tests must leave it unpaused and serving the original weights of ``tiny_model_dir``: a test
    that loads other weights loads the original ones back (under a newer version) when done.
    """
    proc = EngineProcess(tiny_model_dir, free_port()).start()
    yield proc
    proc.stop()


@contextmanager
def engines_started(
    model_dir: Path, settings: dict[str, str] | None = None, timeout_s: float = 60.0
) -> Iterator[Callable[..., EngineProcess]]:
    """A function that starts private engine processes of ``model_dir``; stops them all at the end."""
    started: list[EngineProcess] = []

    def start(port: int | None = None) -> EngineProcess:
        proc = EngineProcess(model_dir, port or free_port(), settings or {}).start(timeout_s)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


@pytest.fixture
def start_engine(tiny_model_dir: Path) -> Iterator[Callable[..., EngineProcess]]:
    """Starts private engine processes (for tests that kill one); stops them afterwards."""
    with engines_started(tiny_model_dir) as start:
        yield start


def perturbed_weights(model_dir: Path, out_dir: Path, scale: float = 1.5) -> Path:
    """A copy of the model's safetensors with every floating tensor scaled: a visibly different policy."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: (v * scale if v.is_floating_point() else v) for k, v in tensors.items()}, str(out_dir / "model.safetensors")
    )
    return out_dir


@pytest.fixture
def run_id() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


def queue_overrides(redis_url: str, run_id: str, **extra: Any) -> dict[str, Any]:
    return {"redis_url": redis_url, "run_id": run_id, "poll_interval_s": 0.02, "stats_refresh_s": 0.2, **extra}
