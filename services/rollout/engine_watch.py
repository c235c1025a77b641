"""Watching the engine: whether it answers, which version it serves once it is up (a restarted
one first gets the held LoRA adapter back), and that it generates rather than sitting paused after
a link outage."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Protocol

from services.engine.client import EngineClient, EngineError
from services.rollout.generation import parse_version
from services.rollout.state import ReplicaState

log = logging.getLogger(__name__)


class AdapterRestore(Protocol):
    """Gives a restarted engine the held adapter back (the weight sync does)."""

    async def restore_adapter(self, engine_version: int) -> int | None: ...


@dataclass
class EngineWatch:
    """``adapters`` (with a weight source) loads the held LoRA adapter into an engine that came back
    from a restart before the replica calls it ready: requests name that adapter from the first
    lease on, and an engine that does not hold it answers each of them with a 400."""

    state: ReplicaState
    engine: EngineClient
    interval_s: float
    adapters: AdapterRestore | None = None

    async def run(self) -> None:
        """Probes the engine every ``interval_s``; learns its version once it is up, and sees that it generates."""
        unpause = False
        while True:
            healthy = await self.engine.health()
            if healthy and not self.state.ready():
                try:
                    version = await self._engine_version()
                except EngineError as exc:
                    log.warning("engine answered /health but not /get_model_info: %r", exc)
                    healthy = False
                else:
                    if version is None:
                        healthy = False  # a weight switch holds the engine; look again next probe
                    else:
                        self.state.engine_reports(version)
                        unpause = True
            if healthy and unpause:
                unpause = not await self._unpause_engine()
            self.state.set_engine_ready(healthy)
            await asyncio.sleep(self.interval_s)

    async def _engine_version(self) -> int | None:
        """The version an engine that just became reachable serves, after giving it the held
        adapter back if it restarted; None while a weight switch or an operator call is under way."""
        version = parse_version(await self.engine.weight_version(), self.state.held_version)
        if self.adapters is None or version >= self.state.held_version:
            return version
        return await self.adapters.restore_adapter(version)

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
            except EngineError as exc:
                log.warning("engine did not take continue_generation: %r", exc)
                return False
        return True
