"""Import-time breakages a GPU host showed: a typer without the hook commands/cli.py patches, and the
trainer pulling in the web and queue stack (fastapi, starlette, redis, tenacity) for a benchmark.
Each check runs in a fresh interpreter, so what it imports is what a user's process would."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from relayrl import __version__

REPO = Path(__file__).resolve().parents[2]
SERVING_STACK = ("fastapi", "starlette", "uvicorn", "redis", "tenacity", "httpx")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)


def test_the_trainer_imports_without_the_serving_stack() -> None:
    # What `relayrl bench trainer` loads (its workers build models through services.trainer.trainer).
    pytest.importorskip("torch")  # the trainer computes with it (`make test-py312`'s venv has none)
    done = _python(f"""\
        import sys

        class Absent:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in {SERVING_STACK!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

        sys.meta_path.insert(0, Absent())
        import services.trainer.bench
        import services.trainer.trainer
        import services.trainer.control
        print("imported")
        """)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip() == "imported"


def test_the_cli_loads_on_a_typer_without_display_type_rich() -> None:
    done = _python("""\
        import sys
        from typer.core import TyperOption

        for cls in TyperOption.__mro__:
            if "display_type_rich" in vars(cls):
                delattr(cls, "display_type_rich")
        from commands.cli import main

        sys.argv = ["relayrl", "--version"]
        main()
        """)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip() == __version__


def test_the_relayrl_command_loads_without_torch() -> None:
    # Every command module imports only typer at load (commands/cli.py), so `relayrl --help` is quick
    # and a venv without torch (`make test-py312`) still runs the commands that need none.
    done = _python("""\
        import sys

        class Absent:
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "torch":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, Absent())
        from commands.cli import main

        sys.argv = ["relayrl", "--version"]
        main()
        """)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.strip() == __version__


def test_relayrl_version_flag_prints_the_version() -> None:
    done = subprocess.run([sys.executable, "-m", "commands.cli", "--version"], capture_output=True, text=True, cwd=REPO)
    assert (done.returncode, done.stdout.strip()) == (0, __version__), done.stderr[-1500:]
