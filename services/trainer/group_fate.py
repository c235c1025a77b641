"""What became of each trajectory group the trainer took from the queue: trained (at which step and
version) or dropped (with the reason), answered by ``GET /control/groups/{group_id}``.

The record is the run's ``groups.jsonl`` (written by :class:`~services.trainer.telemetry.Telemetry`),
read back when the trainer starts, so a resumed trainer still knows what the run did before. A
resumed trainer trains the steps after its checkpoint again: a line for step N supersedes every
earlier line for steps N and later (their groups were re-delivered and are queued again until a
line names them). A group the
trainer has not taken is not here: it is still in the queue, or the queue dropped it (see
``relayrl ctl group``, which asks both).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class GroupFate:
    group_id: str
    status: Literal["trained", "dropped"]
    step: int = 0
    version: int = 0
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GroupFates:
    def __init__(self) -> None:
        self._fates: dict[str, GroupFate] = {}
        # step → the groups its current line trained.
        self._steps: dict[int, list[str]] = {}

    @classmethod
    def read(cls, groups_jsonl: Path) -> GroupFates:
        """The fates a run's ``groups.jsonl`` records (none when it does not exist yet)."""
        fates = cls()
        if groups_jsonl.is_file():
            for line in groups_jsonl.read_text().splitlines():
                try:
                    fates.add_line(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line of a killed trainer
        return fates

    def add_line(self, line: dict[str, Any]) -> None:
        """One ``groups.jsonl`` line: a step's trained groups, or groups dropped with a reason."""
        if "dropped" in line:
            for group_id in line["group_ids"]:
                self._fates[group_id] = GroupFate(group_id, "dropped", reason=str(line["dropped"]))
            return
        step = int(line["step"])
        for redone in [t for t in self._steps if t >= step]:
            for group_id in self._steps.pop(redone):
                fate = self._fates.get(group_id)
                if fate is not None and fate.status == "trained" and fate.step == redone:
                    del self._fates[group_id]
        self._steps[step] = list(line["group_ids"])
        for group_id in line["group_ids"]:
            self._fates[group_id] = GroupFate(group_id, "trained", step, int(line["version"]))

    def get(self, group_id: str) -> GroupFate | None:
        return self._fates.get(group_id)
