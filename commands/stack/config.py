"""Settings of the local stack and the YAML file ``relayrl up --config`` reads.

The file has one ``stack`` section (this model) and one section per service whose keys are
that service's settings fields; ``trainer: {total_steps: 50}`` becomes
``RELAYRL_TRAINER_TOTAL_STEPS=50`` in the trainer's environment, so the file and the
environment variables are two spellings of the same settings. :mod:`commands.stack.check`
validates every section with the service's own settings model before anything starts, so a
typo fails at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from commands.stack.cpus import CpusSetting
from commands.stack.restart import RestartMode, RestartPolicy
from relayrl.devices import DeviceName

SERVICE_SECTIONS = ("queue", "paramsync", "engine", "rollout", "trainer", "reward")


class StackSettings(BaseModel):
    """The shape of the deployment on this machine."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field("", description="Run name; empty generates a timestamped one.")
    runs_dir: Path = Field(Path("runs"), description="Each run writes runs/<run_id>/ (metrics, logs, checkpoints).")
    model_dir: Path | None = Field(
        None,
        description="Hugging Face model directory (relative to the config file); empty creates the built-in tiny"
        " model in the run directory.",
    )
    import_dirs: list[str] = Field(
        default_factory=list,
        description="Folders (relative to the config file) on the rollouts' PYTHONPATH, for the modules the"
        " config names: tool and interaction classes, 'module:function' rewards. The config file's own folder is"
        " always added first.",
    )
    model_preset: Literal["tiny", "small", "base"] = Field(
        "tiny",
        description="Size of the built-in model when model_dir is empty: tiny (~260 k parameters), small (~13 M)"
        " or base (Qwen2.5-0.5B's shape, ~494 M); see `relayrl model init-tiny --preset`.",
    )
    tiny_arch: str = Field("qwen2", pattern="^(qwen2|llama)$", description="Architecture of the built-in tiny model.")
    tiny_seed: int = Field(0, description="Seed of the built-in tiny model's initialisation.")
    rollout_replicas: int = Field(1, ge=1, le=16, description="N: built-in engines, each with one rollout replica.")
    trainer_procs: int = Field(
        1,
        ge=1,
        le=16,
        description="P: trainer processes (one forms its own group, more run under torchrun).",
    )
    max_staleness: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        1,
        description="η: the staleness bound every service enforces; auto: the trainer picks η in"
        " [0, max_staleness_limit] as it goes and every other service holds the limit (docs/auto-staleness.md).",
    )
    max_staleness_limit: int = Field(
        4, ge=0, description="With max_staleness auto: the highest η the trainer may pick, every other service's bound."
    )
    redis_url: str = Field("", description="Use this Redis instead of starting a private redis-server.")
    redis_appendfsync: str = Field("everysec", pattern="^(always|everysec|no)$", description="AOF fsync policy.")
    api_token: str = Field("", description="Bearer token for control routes; empty generates one per run.")
    ready_timeout_s: float = Field(180.0, gt=0, description="Longest wait for one component to become ready.")
    cpus: CpusSetting = Field(
        "auto",
        description="CPU sets of the engines and the trainer: 'auto' (half each), 'off' (no pinning, one torch"
        " thread each), or {engines: [ids], trainer: [ids]}; torch threads follow each set's size"
        " (see commands/stack/cpus.py).",
    )
    device: DeviceName = Field(
        "cpu",
        description="Where the trainer and every engine compute: cpu, or cuda (each section's own device wins;"
        " `relayrl check` and `up` refuse it where torch sees no CUDA device). See commands/stack/gpus.py for the"
        " GPU split.",
    )
    gpus: list[int] | None = Field(
        None,
        description="With device cuda: the GPUs to use (nvidia-smi's ids); empty: this process's"
        " CUDA_VISIBLE_DEVICES, else every GPU torch counts. Trainer ranks take the first ones, then the engines;"
        " with fewer GPUs than components they share (said at start).",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="With device cuda, on a GPU the trainer shares with engines: the fraction of its memory the"
        " engines on it take together (verl's rollout.gpu_memory_utilization); the trainer keeps the rest."
        " Becomes each engine's mem_fraction_static unless the engine section sets that or max_total_tokens.",
    )
    restart: RestartMode = Field(
        "on-failure",
        description="Restart a component that died: always, on-failure (non-zero exit or signal) or never"
        " (Docker's and Kubernetes' restartPolicy).",
    )
    restart_backoff_s: float = Field(1.0, gt=0, description="Delay before the first restart, doubled per restart.")
    restart_max_backoff_s: float = Field(30.0, gt=0, description="Longest delay between restarts.")
    restart_limit: int = Field(
        5, ge=1, description="Restarts of one component within restart_window_s before the stack stops, naming it."
    )
    restart_window_s: float = Field(300.0, gt=0, description="Window over which restart_limit counts.")

    @property
    def staleness_bound(self) -> int:
        """The bound every service but an auto trainer enforces: η, or the limit under auto."""
        return self.max_staleness_limit if self.max_staleness == "auto" else self.max_staleness

    def restart_policy(self) -> RestartPolicy:
        return RestartPolicy(
            self.restart, self.restart_backoff_s, self.restart_max_backoff_s, self.restart_limit, self.restart_window_s
        )


class CustomRewardFunction(BaseModel):
    """verl's ``custom_reward_function``: a Python file (relative to the config file) and a function in it."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="The reward file, e.g. my_reward.py.")
    name: str = Field("compute_score", min_length=1, description="The function in that file.")


class StackConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    stack: StackSettings = Field(default_factory=StackSettings)
    custom_reward_function: CustomRewardFunction | None = Field(
        None, description="verl's reward-file form; becomes rollout.reward_function '<file>:<name>'."
    )
    queue: dict[str, Any] = Field(default_factory=dict)
    paramsync: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)
    rollout: dict[str, Any] = Field(default_factory=dict)
    trainer: dict[str, Any] = Field(default_factory=dict)
    reward: dict[str, Any] = Field(
        default_factory=dict,
        description="The reward service's settings; with a model_path the stack starts it and every rollout"
        " scores with it (rollout.reward_kind 'model' unless the rollout section says 'rule+model').",
    )

    @classmethod
    def from_yaml(cls, path: Path) -> StackConfig:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping with sections stack, {', '.join(SERVICE_SECTIONS)}")
        return cls.model_validate(data)

    def uses_reward_model(self) -> bool:
        """Whether the config names a reward model, so the stack runs the reward service."""
        return bool(self.reward.get("model_path"))

    def section_env(self, service: str) -> dict[str, str]:
        """A service section as the environment variables its settings model reads."""
        section: dict[str, Any] = getattr(self, service)
        return {f"RELAYRL_{service.upper()}_{key.upper()}": _env_value(value) for key, value in section.items()}


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | dict):
        import json

        return json.dumps(value)
    return str(value)
