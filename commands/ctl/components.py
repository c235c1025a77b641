"""What ``relayrl ctl`` reads from and asks of each component, as typed values.

Routes (every service: ``relayrl.http_app.CONTROL_PREFIX``): rollout ``POST /control/pause {"mode"}``,
``POST /control/resume``, ``GET /control/status``; trainer
``POST /control/pause`` (stop consuming), ``POST /control/resume``, ``POST /control/checkpoint``,
``GET /control/status``; queue ``TrajectoryQueue.Stats`` and ``PromptQueue.Stats``; paramsync
``ParamSync.ListReplicas``.

Each report is the service's own status type (``services.rollout.state.Status``,
``services.trainer.status.TrainerStatus``, ``services.queue.stats.QueueStats``,
``services.paramsync.manifest.ReplicaVersion``) with the endpoint it was read from, so a field
added to a service's status reaches ``relayrl ctl`` without a second copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import SecretStr

from commands.ctl.calls import CallError, HttpControl, grpc_call
from relayrl.v1 import paramsync_pb2, paramsync_pb2_grpc, queue_pb2, queue_pb2_grpc
from services.paramsync.manifest import ReplicaVersion
from services.queue.stats import PromptQueueStats, QueueStats, from_proto
from services.rollout.state import Status
from services.trainer.status import TrainerStatus

PauseMode = Literal["abort", "retract", "in_place"]
D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class ReplicaReport(Status):
    """A rollout replica's own status, as read from ``endpoint``."""

    endpoint: str

    @property
    def lag(self) -> int:
        return max(self.latest_version - self.weight_version, 0)


@dataclass(frozen=True, slots=True)
class TrainerReport(TrainerStatus):
    """The trainer's own status, as read from ``endpoint``."""

    endpoint: str


@dataclass(frozen=True, slots=True)
class QueueReport(QueueStats):
    """The trajectory queue's counters with the prompt queue's two gauges, read from ``endpoint``."""

    endpoint: str
    prompts_waiting: int
    prompts_leased: int


@dataclass(frozen=True)
class ParamsyncReport:
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

    def status(self) -> ReplicaReport:
        return _from_answer(ReplicaReport, self.url, self._http.call("GET", "status"), endpoint=self.url)

    def pause(self, mode: PauseMode) -> ReplicaReport:
        answer = self._http.call("POST", "pause", {"mode": mode})
        return _from_answer(ReplicaReport, self.url, answer, endpoint=self.url)

    def resume(self) -> ReplicaReport:
        return _from_answer(ReplicaReport, self.url, self._http.call("POST", "resume"), endpoint=self.url)


class TrainerControl:
    def __init__(self, url: str, token: SecretStr, timeout_s: float) -> None:
        self.url = url
        self._http = HttpControl(url, token, timeout_s)

    def status(self) -> TrainerReport:
        return _from_answer(TrainerReport, self.url, self._http.call("GET", "status"), endpoint=self.url)

    def pause(self) -> dict[str, Any]:
        return self._http.call("POST", "pause")

    def resume(self) -> dict[str, Any]:
        return self._http.call("POST", "resume")

    def checkpoint(self) -> dict[str, Any]:
        return self._http.call("POST", "checkpoint")


def queue_counters(address: str, timeout_s: float) -> tuple[QueueStats, PromptQueueStats]:
    """The queue service's trajectory and prompt counters, each read once."""
    trajectories = grpc_call(
        address,
        "TrajectoryQueue.Stats",
        lambda ch, options: queue_pb2_grpc.TrajectoryQueueStub(ch).Stats(queue_pb2.StatsRequest(), **options),
        timeout_s,
    )
    prompts = grpc_call(
        address,
        "PromptQueue.Stats",
        lambda ch, options: queue_pb2_grpc.PromptQueueStub(ch).Stats(queue_pb2.PromptStatsRequest(), **options),
        timeout_s,
    )
    return from_proto(QueueStats, trajectories), from_proto(PromptQueueStats, prompts)


def queue_status(address: str, timeout_s: float) -> QueueReport:
    counters, prompts = queue_counters(address, timeout_s)
    return QueueReport(
        **dataclasses.asdict(counters),
        endpoint=address,
        prompts_waiting=prompts.waiting,
        prompts_leased=prompts.leased,
    )


def paramsync_status(address: str, timeout_s: float) -> ParamsyncReport:
    answer = grpc_call(
        address,
        "ParamSync.ListReplicas",
        lambda ch, options: paramsync_pb2_grpc.ParamSyncStub(ch).ListReplicas(
            paramsync_pb2.ListReplicasRequest(), **options
        ),
        timeout_s,
    )
    replicas = [ReplicaVersion.from_proto(r) for r in answer.replicas]
    return ParamsyncReport(address, answer.latest_version, sorted(replicas, key=lambda r: r.replica_id))
