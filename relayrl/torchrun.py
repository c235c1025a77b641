"""``python -m relayrl.torchrun ARGS``: torchrun (``python -m torch.distributed.run ARGS``) whose
launcher process spends no time collecting garbage it does not have.

The launcher imports torch, starts the workers and watches them. Its imports build a heap that
lives as long as the process; collecting it while it grows, and once more at exit, costs about a
second on the trainer's CPUs per start and stop. So the imports run with the collector off and
are then left out of every collection (``gc.freeze``); the watching loop is collected as usual.
"""

from __future__ import annotations

import atexit
import gc

if __name__ == "__main__":
    gc.disable()
    from torch.distributed.run import main

    gc.freeze()
    gc.enable()
    # Runs before the interpreter's last collection, which then skips everything built so far.
    atexit.register(gc.freeze)
    main()
