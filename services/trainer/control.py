"""REST control of a running trainer (bearer token): pause and resume consuming, checkpoint
now, status. The routes only flip flags; the training loop acts on them between steps."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter

from services.trainer.status import TrainerStatus


class Control:
    """Flags shared between the HTTP thread and the training loop."""

    def __init__(self) -> None:
        self.consuming = threading.Event()
        self.consuming.set()
        self.checkpoint_requested = threading.Event()
        self.stop_requested = threading.Event()
        self.ready = threading.Event()


def control_router(control: Control, status: Callable[[], TrainerStatus]) -> APIRouter:
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
        """Checkpoint at the next step that ends on a publish boundary (see TrainerSettings.checkpoint_every)."""
        control.checkpoint_requested.set()
        return {"checkpoint_requested": True}

    @router.get("/status")
    async def get_status() -> dict[str, Any]:
        return asdict(status())

    return router
