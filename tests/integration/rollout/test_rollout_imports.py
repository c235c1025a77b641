"""The rollout service never loads torch: it talks to engines over HTTP and hands weight versions
over as files, so its process stays light and restarts in about a second."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_rollout_service_and_its_cli_load_without_torch() -> None:
    code = (
        "import sys; import services.rollout.server, services.rollout.cli; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
