"""The trainer as ``GET /control/status`` reports it: one type for the trainer that builds it and
for ``relayrl ctl`` that reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TrainerStatus:
    step: int
    version: int
    total_steps: int
    # False while paused from the control API: the trainer finishes its step and pulls no more.
    consuming: bool
    checkpoint_requested: bool
    # Groups delivered and held for the next batches, and groups trained on whose
    # acknowledgement waits for a durable checkpoint.
    buffered_groups: int
    unacked_groups: int
    released_prompts: int
    param_sync_count: int
    world_size: int
