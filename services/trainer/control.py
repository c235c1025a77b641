"""REST control of a running trainer (bearer token): pause and resume consuming, checkpoint
now, status. The routes only flip flags; the training loop acts on them between steps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from services.trainer.status import TrainerStatus

if TYPE_CHECKING:
    from fastapi import APIRouter

    from services.trainer.group_fate import GroupFates


class Control:
    """Flags shared between the HTTP thread and the training loop."""

    def __init__(self) -> None:
        self.consuming = threading.Event()
        self.consuming.set()
        self.checkpoint_requested = threading.Event()
        self.stop_requested = threading.Event()
        self.ready = threading.Event()


def control_router(
    control: Control, trainer_status: Callable[[], TrainerStatus], fates: GroupFates | None = None
) -> APIRouter:
    # fastapi only here: the training loop reads Control's flags, and a trainer that serves no REST
    # (a benchmark, `relayrl sft`) never needs the web stack.
    from fastapi import APIRouter, HTTPException, status

    router = APIRouter()

    @router.post("/pause")
    async def pause() -> dict[str, Any]:
        """Stop pulling trajectory groups and releasing prompts after the current step."""
        control.consuming.clear()
        return {"consuming": False}

    @router.post("/resume")
    async def resume() -> dict[str, Any]:
        control.consuming.set()
        return {"consuming": True}

    @router.post("/checkpoint")
    async def checkpoint() -> dict[str, Any]:
        """Checkpoint at the next step that ends on a publish boundary (see TrainerSettings.save_freq)."""
        control.checkpoint_requested.set()
        return {"checkpoint_requested": True}

    @router.get("/status")
    async def get_status() -> dict[str, Any]:
        return asdict(trainer_status())

    @router.get("/groups/{group_id}")
    async def group(group_id: str) -> dict[str, Any]:
        """Trained (step, version) or dropped (reason); 404: the trainer has not taken it (still queued, or
        dropped by the queue itself)."""
        fate = fates.get(group_id) if fates is not None else None
        if fate is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"the trainer has not taken group {group_id}")
        return fate.to_json()

    return router
