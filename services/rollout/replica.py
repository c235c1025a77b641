"""One rollout replica assembled: its :class:`~services.rollout.state.ReplicaState` and the parts
that share it (generation loop, lease keeper, engine watch, weight sync, operator control)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from relayrl.stalls import StallWatch
from services.engine.client import EngineClient
from services.rollout.agent.runtime import AgentRuntime
from services.rollout.config import RolloutSettings
from services.rollout.control import ReplicaControl
from services.rollout.engine_watch import EngineWatch
from services.rollout.groups import GroupBuilder
from services.rollout.leases import LeaseKeeper, ReplicaQueue
from services.rollout.loop import RolloutLoop
from services.rollout.metrics import RolloutMetrics
from services.rollout.rewards import RewardRunner
from services.rollout.rewards.model import ModelReward
from services.rollout.state import ReplicaState
from services.rollout.weight_sync import WeightSource, WeightSync

log = logging.getLogger(__name__)


class Replica:
    """``weight_source`` (paramsync) and ``weights_dir`` are given together, or neither (a fixed policy)."""

    def __init__(
        self,
        settings: RolloutSettings,
        engine: EngineClient,
        queue: ReplicaQueue,
        rewards: RewardRunner,
        weight_source: WeightSource | None = None,
        weights_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = RolloutMetrics()
        self.state = ReplicaState(settings.replica_id, self.metrics)
        stalls = StallWatch(self.metrics.stalled, settings.stall_warn_s, log)
        leases = LeaseKeeper(
            self.state, queue, self.metrics, stalls, settings.lease_block_timeout_s, settings.push_timeout_s
        )
        self.model_reward = ModelReward.from_settings(settings, self.metrics)
        groups = GroupBuilder(settings, rewards, self.metrics, self.model_reward)
        agent = AgentRuntime(settings, self.metrics) if settings.multi_turn_enable else None
        self.loop = RolloutLoop(settings, self.state, engine, leases, groups, self.metrics, stalls, agent)
        self.engine_watch = EngineWatch(self.state, engine, settings.engine_check_interval_s)
        self.control = ReplicaControl(self.state, engine)
        self.weight_sync: WeightSync | None = None
        if weight_source is not None:
            if weights_dir is None:
                raise ValueError("a replica with a weight source needs a weights_dir")
            self.weight_sync = WeightSync(self.state, weight_source, engine, settings, weights_dir, self.metrics)
            self.engine_watch.adapters = self.weight_sync

    def start(self) -> list[asyncio.Task[None]]:
        """Starts the engine watch, the generation loop (unless the source is agents) and (with a weight
        source) the weight sync."""
        tasks = [asyncio.create_task(self.engine_watch.run(), name="engine-probe")]
        if self.settings.source == "prompts":  # 'agents': only the OpenAI endpoint generates
            tasks.append(asyncio.create_task(self.loop.run(), name="replica-loop"))
        if self.weight_sync is not None:
            tasks.append(asyncio.create_task(self.weight_sync.run_forever(), name="weight-sync"))
        return tasks

    async def aclose(self) -> None:
        """Closes what the replica opened itself (the reward service's client)."""
        if self.model_reward is not None:
            await self.model_reward.aclose()
