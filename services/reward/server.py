"""The reward process: serve HTTP at once, load the model beside it, batch ``/score`` until SIGTERM.

``/healthz`` answers from the start; ``/readyz`` turns 200 once the model is loaded, so a probe
(the local stack's, Kubernetes') holds the rollout back until scores can be had. A model that
cannot be loaded ends the process with exit code 1, for the supervisor or Kubernetes to report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from relayrl.http_app import create_http_app
from relayrl.serving import Servers, exit_uncollected, start_servers, wait_for_shutdown_signal
from services.reward.api import install_error_handlers, score_router
from services.reward.batcher import DynamicBatcher
from services.reward.config import RewardSettings
from services.reward.judge import Verdict
from services.reward.metrics import RewardMetrics
from services.reward.scoring import Scorer, load_scorer, set_torch_threads

log = logging.getLogger(__name__)


@dataclass
class ModelSlot:
    """The scorer once loaded; None while loading (or if loading failed)."""

    scorer: Scorer | None = None

    def forward(self, batch: list[list[int]]) -> list[Verdict]:
        assert self.scorer is not None, "the batcher only runs batches of requests admitted after loading"
        return self.scorer.score(batch)


@dataclass
class RunningReward:
    servers: Servers
    slot: ModelSlot
    loading: asyncio.Task[bool]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.servers.http.port

    async def stop(self) -> None:
        await self.servers.stop()
        self.loading.cancel()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def start_reward(settings: RewardSettings) -> RunningReward:
    metrics = RewardMetrics()
    slot = ModelSlot()
    batcher: DynamicBatcher[Verdict] = DynamicBatcher(
        slot.forward, settings.max_batch_size, settings.max_wait_ms / 1000, metrics, lambda: set_torch_threads(settings)
    )
    app = create_http_app("reward", metrics.registry, lambda: slot.scorer is not None, settings.api_token)
    install_error_handlers(app, metrics)
    app.include_router(score_router(settings, lambda: slot.scorer, batcher, metrics))
    servers = await start_servers(settings, app)
    loading = asyncio.create_task(_load(settings, slot, metrics), name="reward-load")
    tasks = [asyncio.create_task(batcher.run(), name="reward-batcher")]
    log.info("reward serving %s on http://%s:%d", settings.model_path, settings.host, servers.http.port)
    return RunningReward(servers, slot, loading, tasks)


async def _load(settings: RewardSettings, slot: ModelSlot, metrics: RewardMetrics) -> bool:
    """True once the model is loaded; False (logged) when it cannot be."""
    try:
        slot.scorer = await asyncio.to_thread(load_scorer, settings)
    except (OSError, ValueError) as exc:
        log.error("cannot load reward model %s: %s", settings.model_path, exc)
        return False
    metrics.model_loaded.set(1)
    return True


async def serve(settings: RewardSettings) -> None:
    """Runs until SIGTERM or SIGINT, or until the model fails to load (then exits with 1)."""
    running = await start_reward(settings)
    signalled = asyncio.create_task(wait_for_shutdown_signal())
    try:
        await asyncio.wait([signalled, running.loading], return_when=asyncio.FIRST_COMPLETED)
        # A signal during loading is an ordinary stop; only a load that ended in failure is not.
        loaded = not running.loading.done() or running.loading.result()
        if loaded:
            await signalled
    finally:
        signalled.cancel()
        await running.stop()
        exit_uncollected()
    if not loaded:
        raise SystemExit(1)
