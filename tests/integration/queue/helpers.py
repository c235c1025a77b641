"""Builders shared by the queue integration tests."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from relayrl.schema import Group, Sample
from relayrl.stalls import StallWatch
from services.queue.client import QueueClient
from services.trainer.config import TrainerSettings
from services.trainer.control import Control
from services.trainer.data import PromptDataset, PromptRow
from services.trainer.feed import Feed
from services.trainer.links import IoThread

log = logging.getLogger(__name__)


def make_group(i: int, version: int = 0, samples: int = 2, tokens: int = 3, is_eval: bool = False) -> Group:
    return Group(
        group_id=f"g{i}",
        prompt_id=f"ds/{i}",
        samples=[
            Sample(
                prompt_token_ids=[1, 2, 3],
                response_token_ids=[4 + j for j in range(tokens)],
                behavior_logprobs=[-0.5] * tokens,
                policy_versions=[version] * tokens,
                reward=float(i),
            )
            for _ in range(samples)
        ],
        is_eval=is_eval,
    )


def trainer_feed(address: str, io: IoThread, **settings: Any) -> Feed:
    """The trainer's side of the queue at ``address`` (its clients run on ``io``), over 64 prompts."""

    async def connect() -> QueueClient:
        return QueueClient(address)

    rows = [PromptRow(f"p/{i}", [1, 2], "s", "", {}) for i in range(64)]
    stalls = StallWatch(Gauge("t_stalled_seconds", "", ["waiting_for", "peer"], registry=CollectorRegistry()), 60, log)
    return Feed(TrainerSettings(**settings), io.call(connect()), io, PromptDataset(rows, seed=0), Control(), stalls)
