"""Prints RelayRL's requirements from pyproject.toml, one a line, with extras expanded.

    python scripts/requirements.py --extras dev,all --without torch

is what `make test-py312` installs (under constraints.txt) into a Python 3.12 venv that has no torch:
PyPI's Linux torch for 3.12 is the CUDA build, which does not import without its nvidia wheels.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def requirements(project: dict, extras: list[str]) -> list[str]:
    """The core dependencies plus each extra's, following self-references (``relayrl[a,b]``)."""
    optional = project.get("optional-dependencies", {})
    lines, todo, seen = list(project["dependencies"]), list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"requirements: no extra {extra!r} in pyproject.toml (has {', '.join(optional)})")
        seen.add(extra)
        for line in optional[extra]:
            own = re.fullmatch(rf"{project['name']}\[(.+)\]", line.replace(" ", ""))
            if own:
                todo.extend(own[1].split(","))
            else:
                lines.append(line)
    return lines


def name_of(line: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0].lower().replace("_", "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extras", default="", help="comma-separated extras to include")
    parser.add_argument("--without", default="", help="comma-separated packages to leave out")
    args = parser.parse_args()
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    without = {name.strip().lower() for name in args.without.split(",") if name.strip()}
    extras = [e.strip() for e in args.extras.split(",") if e.strip()]
    for line in requirements(project, extras):
        if name_of(line) not in without:
            print(line)


if __name__ == "__main__":
    main()
