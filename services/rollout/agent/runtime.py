"""Everything a replica's episodes share, built once from the rollout settings.

The tool and interaction configs load when the replica starts (a bad config fails at once); the
tokenizer loads at the first episode, from ``tokenizer_path`` or else the path the engine reports
in ``/get_model_info`` (the same directory when engine and rollout share a disk).
"""

from __future__ import annotations

import asyncio
from typing import Any

from services.engine.client import EngineClient
from services.rollout.agent.episode import EpisodeEnv, EpisodeLimits
from services.rollout.agent.execution import ToolExecutor
from services.rollout.agent.interactions import load_interactions
from services.rollout.agent.rendering import ObservationRenderer
from services.rollout.agent.tools import load_tools
from services.rollout.config import RolloutSettings
from services.rollout.metrics import RolloutMetrics


class AgentRuntime:
    def __init__(self, settings: RolloutSettings, metrics: RolloutMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        tools, interactions = settings.multi_turn_tool_config_path, settings.multi_turn_interaction_config_path
        self.tools: dict[str, Any] = load_tools(tools) if tools else {}
        self.interactions: dict[str, Any] = load_interactions(interactions) if interactions else {}
        self.executor = ToolExecutor(
            settings.multi_turn_tool_concurrency,
            settings.multi_turn_tool_timeout_s,
            settings.multi_turn_max_tool_response_length,
        )
        self.limits = EpisodeLimits(
            settings.multi_turn_max_assistant_turns,
            settings.multi_turn_max_tokens_per_turn,
            settings.multi_turn_max_parallel_calls,
        )
        self._env: EpisodeEnv | None = None
        self._lock = asyncio.Lock()

    async def env(self, engine: EngineClient) -> EpisodeEnv:
        async with self._lock:
            if self._env is None:
                path = self.settings.tokenizer_path or (await engine.model_info()).get("tokenizer_path") or ""
                if not path:
                    raise ValueError("multi-turn needs tokenizer_path: the engine reports no tokenizer_path")
                renderer = ObservationRenderer(await asyncio.to_thread(_load_tokenizer, path))
                self._env = EpisodeEnv(
                    self.tools, self.interactions, self.executor, renderer, self.limits, self.metrics
                )
            return self._env


def _load_tokenizer(path: str) -> Any:
    from relayrl.models.loading import load_tokenizer

    return load_tokenizer(path)
