"""Prints the test modules under the given folders that import without torch, one a line, for pytest.

`make test-py312` runs the unit tests in a Python 3.12 venv that has no torch (see the Makefile). A
module whose import stops at ``import torch`` is left out and named on stderr; every other module is
passed on, including one that fails to import for another reason, so that pytest reports that error.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def needs_torch(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        return (exc.name or "").partition(".")[0] == "torch"
    except BaseException:  # pytest's skips and any other error are pytest's to report
        return False
    return False


def main(folders: list[str]) -> None:
    sys.path.insert(0, str(REPO))
    kept, left = [], []
    for folder in folders:
        for path in sorted((REPO / folder).rglob("test_*.py")):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts)
            (left if needs_torch(module) else kept).append(str(path.relative_to(REPO)))
    print(f"torch_free_tests: {len(kept)} modules run; {len(left)} need torch and are left out:", file=sys.stderr)
    for name in left:
        print(f"  {name}", file=sys.stderr)
    print("\n".join(kept))


if __name__ == "__main__":
    main(sys.argv[1:] or ["tests/unit"])
