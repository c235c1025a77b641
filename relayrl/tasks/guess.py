"""``guess``: a multi-turn number-guessing game whose interaction answers "higher" or "lower".

The question is ``"guess 0-<high>"`` with ``high = 2**difficulty - 2``, so a binary search finds
any secret in exactly ``difficulty`` guesses and the game allows that many: a policy can only win
every game by reading the interaction's replies (a guess that ignores them wins about a third of
the games at difficulty 3). Each model turn is one guess, a number and nothing else;
:class:`GuessInteraction` (verl's interaction interface, named in
``relayrl/tasks/guess_interaction.yaml``, which a config names ``builtin:guess``) answers
``higher``, ``lower`` or ``say a number``, and ends the game on a right guess or when no guesses
are left.

The secret and the number of guesses travel in the row's ``extra_info.interaction_kwargs``; the
ground truth is the secret, and :func:`score` gives 1.0 when the episode's last model turn (what
the rollout scores) guessed it. Turns score 0: the episode's reward is the final one.
"""

from __future__ import annotations

import random
import re
import uuid
from typing import Any

INTERACTION_NAME = "guess"
_NUMBER = re.compile(r"\s*(\d+)")


def generate(rng: random.Random, difficulty: int) -> tuple[str, str]:
    if difficulty < 1:
        raise ValueError(f"guess needs a difficulty of at least 1 guess, got {difficulty}")
    high = 2**difficulty - 2
    return f"guess 0-{high}", str(rng.randint(0, high))


def interaction_kwargs(question: str, answer: str, difficulty: int) -> dict[str, Any]:
    """The row's ``extra_info`` entry that sets up its game."""
    return {"interaction_kwargs": {"name": INTERACTION_NAME, "secret": int(answer), "max_turns": difficulty}}


def read_guess(text: str) -> int | None:
    """The number a turn starts with; None when it does not start with one."""
    match = _NUMBER.match(text)
    return int(match.group(1)) if match else None


def score(solution: str, ground_truth: str) -> float:
    return float(read_guess(solution) == int(ground_truth))


class GuessInteraction:
    """verl's ``BaseInteraction`` interface; one game per ``instance_id``."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._games: dict[str, dict[str, int]] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or uuid.uuid4().hex
        self._games[instance_id] = {"secret": int(kwargs["secret"]), "left": int(kwargs["max_turns"]), "won": 0}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        game = self._games[instance_id]
        game["left"] -= 1
        guess = read_guess(str(messages[-1]["content"]))
        if guess == game["secret"]:
            game["won"] = 1
            return True, "correct", 0.0, {}
        if game["left"] <= 0:
            return True, "no guesses left", 0.0, {}
        if guess is None:
            return False, "say a number", 0.0, {}
        return False, "higher" if guess < game["secret"] else "lower", 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return float(self._games[instance_id]["won"])

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._games.pop(instance_id, None)
