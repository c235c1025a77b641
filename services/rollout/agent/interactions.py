"""Interactions the way verl users write them: a simulated user or environment that answers each
model turn that makes no tool call, may score the turn, and may end the episode.

An interaction-config YAML lists them by name::

    interaction:
      - name: guess
        class_name: relayrl.tasks.guess.GuessInteraction
        config: {}

Each class takes ``(config: dict)`` and has verl's async methods
``start_interaction(instance_id, **interaction_kwargs) -> str``,
``generate_response(instance_id, messages, **interaction_kwargs) -> (should_terminate, reply,
turn_score, metrics)``, ``calculate_score(instance_id) -> float`` and
``finalize_interaction(instance_id)``. A row picks its interaction with
``extra_info.interaction_kwargs.name`` (the only one configured when it names none), and the other
``interaction_kwargs`` reach every call. ``messages`` is the episode so far as chat messages
(model turns and observations, without the prompt, which the rollout receives as token ids).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from relayrl.tasks.interaction_configs import interaction_config_file
from services.rollout.agent.loading import import_class, read_yaml


class BaseInteraction:
    """Holds its ``config``; subclasses override ``generate_response`` at least."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or uuid.uuid4().hex

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} does not implement generate_response")

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


INTERACTION_METHODS = ("start_interaction", "generate_response", "calculate_score", "finalize_interaction")


def load_interactions(path: str | Path) -> dict[str, Any]:
    """The interactions of an interaction-config YAML, by name (the class name when none is given);
    ``builtin:<task>`` is the config a built-in task ships with."""
    path = interaction_config_file(path)
    interactions: dict[str, Any] = {}
    for i, entry in enumerate(read_yaml(path, "interaction")):
        where = f"{path}: interaction[{i}]"
        if "class_name" not in entry:
            raise ValueError(f"{where} has no class_name")
        name = str(entry.get("name") or entry["class_name"].rpartition(".")[2])
        config = dict(entry.get("config") or {})
        interaction = import_class(entry["class_name"])(config)
        missing = [m for m in INTERACTION_METHODS if not callable(getattr(interaction, m, None))]
        if missing:
            raise ValueError(f"{where}: {entry['class_name']} has no {', '.join(missing)}")
        if name in interactions:
            raise ValueError(f"{where}: a second interaction named {name!r}")
        interactions[name] = interaction
    return interactions


def pick_interaction(interactions: dict[str, Any], kwargs: dict[str, Any]) -> Any | None:
    """The interaction a row's ``interaction_kwargs`` names; None when it has none to talk to."""
    if not interactions or not kwargs:
        return None
    name = kwargs.get("name")
    if name is None and len(interactions) == 1:
        return next(iter(interactions.values()))
    if name not in interactions:
        raise ValueError(f"interaction_kwargs names {name!r}; configured: {', '.join(sorted(interactions))}")
    return interactions[name]
