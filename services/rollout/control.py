"""Operator control of a replica: REST (bearer token) and the RolloutControl gRPC service.

``POST /control/pause`` with ``{"mode": "abort"|"retract"|"in_place"}`` (default abort) stops
leasing and pauses the engine in that mode; ``POST /control/resume``; ``GET /control/status``. Nothing
leased is lost: aborted requests are resubmitted (and held by the paused engine), retracted and
frozen ones continue on resume.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

import grpc
from fastapi import APIRouter, HTTPException, status
from pydantic import BaseModel, ConfigDict

from relayrl.v1 import rollout_pb2 as pb
from relayrl.v1 import rollout_pb2_grpc as pb_grpc
from services.engine.client import EngineClient, EngineError, PauseMode
from services.rollout.state import ReplicaState, Status

_MODES = {pb.PAUSE_MODE_ABORT: "abort", pb.PAUSE_MODE_RETRACT: "retract", pb.PAUSE_MODE_IN_PLACE: "in_place"}


class ReplicaControl:
    """The operator's pause and resume: the replica's state and its engine, changed under the control lock."""

    def __init__(self, state: ReplicaState, engine: EngineClient) -> None:
        self.state = state
        self.engine = engine

    def status(self) -> Status:
        return self.state.status()

    async def pause(self, mode: PauseMode) -> Status:
        """Stops leasing and pauses the engine; leased prompts finish after resume."""
        async with self.state.controlling():
            self.state.set_paused(mode)
            await self.engine.pause_generation(mode)
        return self.state.status()

    async def resume(self) -> Status:
        async with self.state.controlling():
            # Un-pause locally first: an engine that restarted meanwhile is not paused anyway.
            self.state.set_resumed()
            await self.engine.continue_generation()
        return self.state.status()


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mode: Literal["abort", "retract", "in_place"] = "abort"


def control_router(control: ReplicaControl) -> APIRouter:
    router = APIRouter()

    @router.post("/pause")
    async def pause(body: PauseBody | None = None) -> dict[str, Any]:
        try:
            return asdict(await control.pause((body or PauseBody()).mode))
        except EngineError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"engine refused the pause: {exc}") from exc

    @router.post("/resume")
    async def resume() -> dict[str, Any]:
        try:
            return asdict(await control.resume())
        except EngineError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"engine refused to continue: {exc}") from exc

    @router.get("/status")
    async def get_status() -> dict[str, Any]:
        return asdict(control.status())

    return router


def status_proto(status: Status) -> pb.RolloutStatus:
    return pb.RolloutStatus(
        replica_id=status.replica_id,
        weight_version=status.weight_version,
        paused=status.paused,
        in_flight=status.in_flight,
        tokens_per_s=status.tokens_per_s,
        samples_per_s=status.samples_per_s,
        total_generated_samples=status.total_generated_samples,
        generation_errors=status.generation_errors,
        engine_ready=status.engine_ready,
        leases_held=status.leases_held,
        pause_mode=status.pause_mode,
        latest_version=status.latest_version,
    )


class RolloutControlServicer(pb_grpc.RolloutControlServicer):
    def __init__(self, control: ReplicaControl) -> None:
        self.control = control

    async def Pause(self, request: pb.PauseRequest, context: grpc.aio.ServicerContext) -> pb.RolloutStatus:
        mode = _MODES.get(request.mode)
        if mode is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "mode must be PAUSE_MODE_ABORT, PAUSE_MODE_RETRACT or PAUSE_MODE_IN_PLACE",
            )
        try:
            return status_proto(await self.control.pause(mode))  # type: ignore[arg-type]
        except EngineError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"engine refused the pause: {exc}")
            raise

    async def Resume(self, request: pb.ResumeRequest, context: grpc.aio.ServicerContext) -> pb.RolloutStatus:
        try:
            return status_proto(await self.control.resume())
        except EngineError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"engine refused to continue: {exc}")
            raise

    async def Status(self, request: pb.StatusRequest, context: grpc.aio.ServicerContext) -> pb.RolloutStatus:
        return status_proto(self.control.status())
