"""Watching the engine: whether it answers, which version it serves once it is up, and that it
generates rather than sitting paused after a link outage."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import httpx

from services.engine.client import EngineClient, EngineError
from services.rollout.generation import parse_version
from services.rollout.state import ReplicaState

log = logging.getLogger(__name__)


@dataclass
class EngineWatch:
    state: ReplicaState
    engine: EngineClient
    interval_s: float

    async def run(self) -> None:
        """Probes the engine every ``interval_s``; learns its version once it is up, and sees that it generates."""
        unpause = False
        while True:
            healthy = await self.engine.health()
            if healthy and not self.state.ready():
                try:
                    reported = await self.engine.weight_version()
                    self.state.engine_reports(parse_version(reported, self.state.held_version))
                    unpause = True
                except EngineError as exc:
                    log.warning("engine answered /health but not /get_model_info: %r", exc)
                    healthy = False
            if healthy and unpause:
                unpause = not await self._unpause_engine()
            self.state.set_engine_ready(healthy)
            await asyncio.sleep(self.interval_s)

    async def _unpause_engine(self) -> bool:
        """Tells an engine that was out of reach to continue, unless this replica is paused on
        purpose; True once that is settled. A weight switch whose ``continue_generation`` was lost
        with the link leaves the engine paused, and a paused engine answers probes but generates
        nothing, so every in-flight request would wait out its timeout."""
        if self.state.control_busy():
            return False  # a switch or an operator call is under way and settles it; ask again next probe
        async with self.state.controlling():
            if self.state.paused:
                return True
            try:
                await self.engine.continue_generation()
            except (EngineError, httpx.TransportError) as exc:
                log.warning("engine did not take continue_generation: %r", exc)
                return False
        return True
