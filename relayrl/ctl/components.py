"""What ``relayrl ctl`` reads from and asks of each component, as typed values.

Routes (every service: ``relayrl.http_app.CONTROL_PREFIX``): rollout ``POST /control/pause {"mode"}``,
``POST /control/resume``, ``GET /control/status``; trainer
``POST /control/pause`` (stop consuming), ``POST /control/resume``, ``POST /control/checkpoint``,
``GET /control/status``; queue ``TrajectoryQueue.Stats`` and ``PromptQueue.Stats``; paramsync
``ParamSync.ListReplicas``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import SecretStr

from relayrl.ctl.calls import CallError, HttpControl, grpc_call
from relayrl.v1 import paramsync_pb2, paramsync_pb2_grpc, queue_pb2, queue_pb2_grpc

PauseMode = Literal["abort", "retract", "in_place"]
D = TypeVar("D")


@dataclass(frozen=True)
class ReplicaStatus:
    endpoint: str
    replica_id: str
    weight_version: int
    latest_version: int
    paused: bool
    pause_mode: str
    in_flight: int
    leases_held: int
    tokens_per_s: float
    samples_per_s: float
    total_generated_samples: int
    generation_errors: int
    engine_ready: bool

    @property
    def lag(self) -> int:
        return max(self.latest_version - self.weight_version, 0)


@dataclass(frozen=True)
class TrainerStatus:
    endpoint: str
    step: int
    version: int
    total_steps: int
    consuming: bool
    checkpoint_requested: bool
    buffered_groups: int
    unacked_groups: int
    param_sync_count: int
    world_size: int


@dataclass(frozen=True)
class QueueStatus:
    endpoint: str
    queue_size: int
    pending: int
    capacity: int
    total_produced: int
    total_consumed: int
    dropped_by_reason: dict[str, int]
    consumer_lag: int
    avg_sample_age_versions: float
    max_sample_age_versions: float
    stale_samples_ratio: float
    prompts_waiting: int
    prompts_leased: int


@dataclass(frozen=True)
class ReplicaVersion:
    replica_id: str
    version: int
    lag_versions: int
    state: str
    consecutive_failures: int
    last_error: str


@dataclass(frozen=True)
class ParamsyncStatus:
    endpoint: str
    latest_version: int
    replicas: list[ReplicaVersion] = field(default_factory=list)


def _from_answer(cls: type[D], url: str, answer: dict[str, Any], **extra: Any) -> D:
    """Builds ``cls`` from a JSON answer, naming the missing keys if the answer does not fit."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in extra]  # type: ignore[arg-type]
    missing = [name for name in names if name not in answer]
    if missing:
        raise CallError(url, f"unexpected answer: missing {', '.join(missing)}")
    return cls(**{name: answer[name] for name in names}, **extra)


class RolloutControl:
    def __init__(self, url: str, token: SecretStr, timeout_s: float) -> None:
        self.url = url
        self._http = HttpControl(url, token, timeout_s)

    def status(self) -> ReplicaStatus:
        return _from_answer(ReplicaStatus, self.url, self._http.call("GET", "/control/status"), endpoint=self.url)

    def pause(self, mode: PauseMode) -> ReplicaStatus:
        answer = self._http.call("POST", "/control/pause", {"mode": mode})
        return _from_answer(ReplicaStatus, self.url, answer, endpoint=self.url)

    def resume(self) -> ReplicaStatus:
        return _from_answer(ReplicaStatus, self.url, self._http.call("POST", "/control/resume"), endpoint=self.url)


class TrainerControl:
    def __init__(self, url: str, token: SecretStr, timeout_s: float) -> None:
        self.url = url
        self._http = HttpControl(url, token, timeout_s)

    def status(self) -> TrainerStatus:
        return _from_answer(TrainerStatus, self.url, self._http.call("GET", "/control/status"), endpoint=self.url)

    def pause(self) -> dict[str, Any]:
        return self._http.call("POST", "/control/pause")

    def resume(self) -> dict[str, Any]:
        return self._http.call("POST", "/control/resume")

    def checkpoint(self) -> dict[str, Any]:
        return self._http.call("POST", "/control/checkpoint")


def queue_status(address: str, timeout_s: float) -> QueueStatus:
    trajectories = grpc_call(
        address,
        "TrajectoryQueue.Stats",
        lambda ch: queue_pb2_grpc.TrajectoryQueueStub(ch).Stats(queue_pb2.StatsRequest(), timeout=timeout_s),
        timeout_s,
    )
    prompts = grpc_call(
        address,
        "PromptQueue.Stats",
        lambda ch: queue_pb2_grpc.PromptQueueStub(ch).Stats(queue_pb2.PromptStatsRequest(), timeout=timeout_s),
        timeout_s,
    )
    return QueueStatus(
        endpoint=address,
        queue_size=trajectories.queue_size,
        pending=trajectories.pending,
        capacity=trajectories.capacity,
        total_produced=trajectories.total_produced,
        total_consumed=trajectories.total_consumed,
        dropped_by_reason=dict(trajectories.dropped_by_reason),
        consumer_lag=trajectories.consumer_lag,
        avg_sample_age_versions=trajectories.avg_sample_age_versions,
        max_sample_age_versions=trajectories.max_sample_age_versions,
        stale_samples_ratio=trajectories.stale_samples_ratio,
        prompts_waiting=prompts.waiting,
        prompts_leased=prompts.leased,
    )


def paramsync_status(address: str, timeout_s: float) -> ParamsyncStatus:
    answer = grpc_call(
        address,
        "ParamSync.ListReplicas",
        lambda ch: paramsync_pb2_grpc.ParamSyncStub(ch).ListReplicas(
            paramsync_pb2.ListReplicasRequest(), timeout=timeout_s
        ),
        timeout_s,
    )
    replicas = [
        ReplicaVersion(r.replica_id, r.version, r.lag_versions, r.state, r.consecutive_failures, r.last_error)
        for r in answer.replicas
    ]
    return ParamsyncStatus(address, answer.latest_version, sorted(replicas, key=lambda r: r.replica_id))
