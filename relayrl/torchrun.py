"""``python -m relayrl.torchrun ARGS``: torchrun (``python -m torch.distributed.run ARGS``) whose
launcher process spends no time collecting garbage it does not have, and whose workers are forked
from the fork server where one is named.

The launcher imports torch, starts the workers and watches them. Its imports build a heap that
lives as long as the process; collecting it while it grows, and once more at exit, costs about a
second on the trainer's CPUs per start and stop. So the imports run with the collector off and
are then left out of every collection (``gc.freeze``); the watching loop is collected as usual.

Each worker is ``python -u -m MODULE ...``; where ``RELAYRL_FORKSERVER`` names a fork server
(:mod:`relayrl.forkserver`), it is started through :func:`relayrl.subprocesses.start_process`
instead, unbuffered as ``-u`` asks, so a worker does not import torch and transformers again.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
from typing import Any

from relayrl.forkserver import ENV_VARIABLE


def _fork_workers() -> None:
    """Starts torchrun's Python workers through :func:`start_process` (its ``SubprocessHandler``
    makes one Popen per worker; a torch without that hook keeps starting them itself)."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    from relayrl.subprocesses import start_process

    handler = subprocess_handler.SubprocessHandler
    popen = getattr(handler, "_popen", None)
    if popen is None:
        return

    def _popen(self: Any, args: tuple, env: dict[str, str]) -> Any:
        if list(args[:3]) != [sys.executable, "-u", "-m"]:
            return popen(self, args, env)
        return start_process(
            [sys.executable, "-m", *args[3:]],
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=self._stdout,
            stderr=self._stderr,
            new_session=True,
        )

    handler._popen = _popen


if __name__ == "__main__":
    gc.disable()
    from torch.distributed.run import main

    if os.environ.get(ENV_VARIABLE):
        _fork_workers()
    gc.freeze()
    gc.enable()
    # Runs before the interpreter's last collection, which then skips everything built so far.
    atexit.register(gc.freeze)
    main()
