"""Where the Triton kernels' CPU checks find Triton, and the processes they run in.

torch's CPU wheels bring no Triton, and ``make setup`` does not put one on the venv's own path:
torch's dynamo imports an installed Triton, so every CPU process that touches ``torch.compile``
would load it and print nanobind's leak report at exit. It installs Triton into ``.venv/triton``
instead, and the checks' processes put that folder on theirs. Where the environment has a Triton of
its own (a GPU host's, or any CUDA torch's, which runs only with the Triton it was built with), the
checks run that one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[3]
TRITON_DIR = REPO / ".venv" / "triton"


def _own_triton() -> bool:
    """Whether this interpreter's environment has a Triton of its own (a CUDA torch brings the one it
    was built with, and only that one runs with it)."""
    return importlib.util.find_spec("triton") is not None


def triton_version() -> tuple[int, ...] | None:
    """The version of the Triton the checks would run, or None where there is none."""
    where = {} if _own_triton() else {"path": [str(TRITON_DIR)]}
    found = [d.version for d in importlib.metadata.distributions(name="triton", **where)]
    return tuple(int(part) for part in found[0].split(".")[:2]) if found else None


def run_checks(module: str, *args: str, interpret: bool) -> list[str]:
    """Runs ``python -m module args`` with Triton on its path (and its interpreter on when
    ``interpret``: set before Triton is imported, and in no other process, since an engine another
    test starts inherits the environment); returns the lines it printed, failing on its error."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    if not _own_triton() and TRITON_DIR.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(TRITON_DIR), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()
