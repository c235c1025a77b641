"""A slow environment for the agentic bench: any verl interaction, answering after a set latency.

A remote environment or tool answers after a network round trip. :class:`SlowInteraction` wraps an
interaction class and waits ``latency_ms`` inside each ``generate_response`` (an ``asyncio.sleep``:
it holds no thread and, since the episode is between turns, no engine slot), so the rollout meets
exactly what a slow environment would show it; the bench adds nothing to its own figures. Each reply
also appends ``<unix time> <seconds>`` to ``call_log``, the environment's own record of its calls,
which :func:`read_calls` sums over a measurement window.

Named in an interaction config like any interaction::

    interaction:
      - name: guess
        class_name: commands.stack.environment.SlowInteraction
        config: {interaction: relayrl.tasks.guess.GuessInteraction, config: {}, latency_ms: 200, call_log: calls.log}
"""

from __future__ import annotations

import asyncio
import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _import(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class SlowInteraction:
    """verl's ``BaseInteraction`` interface around ``config['interaction']``, each reply ``latency_ms`` late."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.inner = _import(config["interaction"])(dict(config.get("config") or {}))
        self.latency_s = float(config["latency_ms"]) / 1000.0
        self.call_log = Path(config["call_log"])

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return await self.inner.start_interaction(instance_id, **kwargs)

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        started = time.perf_counter()
        await asyncio.sleep(self.latency_s)
        reply = await self.inner.generate_response(instance_id, messages, **kwargs)
        # Appended and closed at once: each call is on disk when it returns, whenever the bench reads.
        with self.call_log.open("a") as log:
            log.write(f"{time.time():.6f} {time.perf_counter() - started:.6f}\n")
        return reply

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return await self.inner.calculate_score(instance_id, **kwargs)

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        await self.inner.finalize_interaction(instance_id, **kwargs)


@dataclass(frozen=True, slots=True)
class Calls:
    count: int
    seconds: float


def read_calls(path: Path, start: float, end: float) -> Calls:
    """The calls of ``call_log`` that ended between unix times ``start`` and ``end``, and their seconds."""
    count, seconds = 0, 0.0
    if path.exists():
        for line in path.read_text().splitlines():
            at, took = (float(x) for x in line.split())
            if start <= at <= end:
                count, seconds = count + 1, seconds + took
    return Calls(count, seconds)
