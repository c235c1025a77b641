"""When the local stack restarts a component that died, as Docker's and Kubernetes' restart
policies do: ``always``, ``on-failure`` (a non-zero exit or a signal) or ``never``.

Restarts back off exponentially (``backoff_s``, doubled per restart still inside the window, up
to ``max_backoff_s``), and a component that needs more than ``limit`` restarts within
``window_s`` stops the stack, named, instead of crash-looping forever.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

RestartMode = Literal["always", "on-failure", "never"]


@dataclass(frozen=True)
class RestartPolicy:
    mode: RestartMode = "on-failure"
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    limit: int = 5
    window_s: float = 300.0

    def wants_restart(self, exit_code: int) -> bool:
        if self.mode == "always":
            return True
        return self.mode == "on-failure" and exit_code != 0


@dataclass
class RestartRecord:
    """One component's restart history, and the restart it is waiting for (if any)."""

    restarts: int = 0
    last_exit_code: int | None = None
    last_restart_at: float | None = None
    due_at: float | None = None  # monotonic time of the scheduled restart
    recent: deque[float] = field(default_factory=deque)  # monotonic times of restarts in the window

    def in_window(self, policy: RestartPolicy, now: float) -> int:
        while self.recent and now - self.recent[0] > policy.window_s:
            self.recent.popleft()
        return len(self.recent)

    def schedule(self, policy: RestartPolicy, exit_code: int, now: float) -> float:
        """Schedules the next restart; returns its delay."""
        self.last_exit_code = exit_code
        delay = min(policy.backoff_s * 2 ** self.in_window(policy, now), policy.max_backoff_s)
        self.due_at = now + delay
        return delay

    def restarted(self, now: float) -> None:
        self.restarts += 1
        self.recent.append(now)
        self.last_restart_at = time.time()
        self.due_at = None


def write_restarts(path: Path, records: dict[str, RestartRecord], running: dict[str, bool]) -> None:
    """``restarts.json`` in the run directory, which ``relayrl ctl status --all`` shows."""
    data = {
        name: {
            "restarts": r.restarts,
            "last_exit_code": r.last_exit_code,
            "last_restart_at": r.last_restart_at,
            "running": running.get(name, False),
        }
        for name, r in records.items()
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)
