"""``python -m relayrl.torchrun ARGS``: torchrun (``python -m torch.distributed.run ARGS``) whose
launcher process spends no time collecting garbage it does not have, and leaves no log directory
behind that nobody asked for.

The launcher imports torch, starts the workers and watches them. Its imports build a heap that
lives as long as the process; collecting it while it grows, and once more at exit, costs about a
second on the trainer's CPUs per start and stop. So the imports run with the collector off and
are then left out of every collection (``gc.freeze``); the watching loop is collected as usual.

Without ``--log-dir`` torchrun makes a ``torchelastic_*`` directory in the temporary directory for
the workers' error files and never removes it: one per job, hundreds on a machine that runs the
tests. Here such a job gets a directory of its own that goes when the launcher exits; one given
``--log-dir`` keeps it, as torchrun would.
"""

from __future__ import annotations

import atexit
import gc
import shutil
import sys
import tempfile


def _with_own_log_dir(argv: list[str]) -> list[str]:
    # Put first, so that a --log-dir of the caller's, which argparse reads later, still wins.
    log_dir = tempfile.mkdtemp(prefix="relayrl-torchrun-")
    atexit.register(shutil.rmtree, log_dir, ignore_errors=True)
    return ["--log-dir", log_dir, *argv]


if __name__ == "__main__":
    gc.disable()
    from torch.distributed.run import main

    gc.freeze()
    gc.enable()
    # Runs before the interpreter's last collection, which then skips everything built so far.
    atexit.register(gc.freeze)
    main(_with_own_log_dir(sys.argv[1:]))
