"""A pytest worker that dies ends `make test` at once, naming its test, instead of hanging.

xdist starts a replacement worker by default, and our scope scheduler (tests/conftest.py) then
hands the dead worker's scope out again and waits for good: a run hung until CI's limit after the
kernel killed a worker for memory. The Makefile's pytest options for xdist prevent that.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """\
from tests.conftest import pytest_xdist_make_scheduler  # make test's scheduler, nothing else
"""
# An integration module is one scope of the scheduler; unit tests, each its own, keep the other
# worker busy. Without the Makefile's options this layout hangs after the crash (checked).
CRASHING = """\
import os


def test_before():
    pass


def test_dies():
    os._exit(1)


def test_after():
    pass
"""
QUICK = "\n\n".join(f"def test_{i}():\n    pass\n" for i in range(10))


def make_xdist_options() -> list[str]:
    """The xdist options every `make test*` target passes to pytest, read from the Makefile."""
    show = "show-xdist: ; @printf '%s\\n' '$(XDIST)'"
    shown = subprocess.run(
        ["make", "-s", "-C", str(REPO), "--eval", show, "show-xdist", "PYTEST_WORKERS=2"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return shlex.split(shown.stdout)


def test_a_dead_worker_ends_the_run_naming_its_test(tmp_path: Path) -> None:
    options = make_xdist_options()
    assert "-n" in options
    (tmp_path / "conftest.py").write_text(CONFTEST)
    for slice_, module, text in (("integration", "test_crash.py", CRASHING), ("unit", "test_quick.py", QUICK)):
        (tmp_path / "tests" / slice_).mkdir(parents=True)
        (tmp_path / "tests" / slice_ / module).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # A hang shows as TimeoutExpired: the run needs a few seconds.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert "crashed while running" in output and "tests/integration/test_crash.py::test_dies" in output, output[-3000:]
