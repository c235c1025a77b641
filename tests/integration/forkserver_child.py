"""Run through the fork server by test_forkserver.py: reports what it was started with as one JSON
line on stdout, a line on stderr, then exits with the code its first argument names."""

from __future__ import annotations

import json
import os
import sys

if __name__ == "__main__":
    preloaded = "torch" in sys.modules
    import torch

    print("to stderr", file=sys.stderr)
    report = {
        "argv": sys.argv[1:],
        "cwd": os.getcwd(),
        "marker": os.environ.get("CHILD_MARKER"),
        "own_session": os.getsid(0) == os.getpid(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "main": __name__,
        "stdin": sys.stdin.read(),
        "preloaded": preloaded,
        "path": sys.path[:2],
        "hub_offline": __import__("huggingface_hub.constants").constants.HF_HUB_OFFLINE,
    }
    print(json.dumps(report), flush=True)
    if sys.argv[1] == "wait":
        import time

        time.sleep(60)
    sys.exit(int(sys.argv[1]))
