"""``python -m relayrl.torchrun`` leaves no ``torchelastic_*`` directory in the temporary directory,
after a job that succeeds and after one that fails, and leaves a ``--log-dir`` its caller names in place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _torchrun(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # `--no-python true` runs /bin/true as the rank: the launcher's own work, without a worker's imports.
    return subprocess.run(
        [sys.executable, "-m", "relayrl.torchrun", "--standalone", "--nproc-per-node=1", *args],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("rank", "returncode"), [("true", 0), ("false", 1)])
def test_a_job_leaves_nothing_in_the_temporary_directory(tmp_path: Path, rank: str, returncode: int) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = _torchrun(tmp, "--no-python", rank)
    assert done.returncode == returncode, done.stderr[-3000:]
    assert sorted(p.name for p in tmp.iterdir()) == []


def test_a_log_dir_the_caller_names_is_used_and_kept(tmp_path: Path) -> None:
    tmp, logs = tmp_path / "tmp", tmp_path / "logs"
    tmp.mkdir()
    done = _torchrun(tmp, "--log-dir", str(logs), "--no-python", "false")
    assert done.returncode == 1, done.stderr[-3000:]
    assert [p.name for p in tmp.iterdir()] == [] and any(logs.iterdir())
