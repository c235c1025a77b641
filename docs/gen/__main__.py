"""``python -m docs.gen``: regenerate the references, the figure blocks and the plots.

``--check`` writes nothing and exits 1 naming every stale file (the suite runs the same check).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from docs.gen import blocks, cli_ref, plots, settings_ref
from docs.gen import figures as fig

COMMAND = ".venv/bin/python -m docs.gen"
PAGES: dict[Path, Callable[[], str]] = {
    fig.DOCS / "reference" / "configuration.md": settings_ref.render,
    fig.DOCS / "reference" / "cli.md": cli_ref.render,
}


def expected() -> dict[Path, str]:
    """Every generated text file as it should read now."""
    pages = {path: render() for path, render in PAGES.items()}
    for page in blocks.pages():
        if page in pages or not page.is_file():
            continue
        text = page.read_text()
        filled = blocks.fill(text, page)
        if filled != text or blocks.BLOCK.search(text):
            pages[page] = filled
    return pages


def stale() -> list[str]:
    """Generated files that differ from a fresh generation, and plots that are missing."""
    found = [
        path.relative_to(blocks.ROOT).as_posix()
        for path, text in expected().items()
        if not path.is_file() or path.read_text() != text
    ]
    for name in fig.names():
        if fig.load(name).plot is not None and not (fig.FIGURES / f"bench-{name}.png").is_file():
            found.append(f"docs/figures/bench-{name}.png")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if a generated file is stale.")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"stale: {path}")
        if found:
            print(f"regenerate with: {COMMAND}")
        return 1 if found else 0
    for path, text in expected().items():
        if not path.is_file() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(blocks.ROOT)}")
    for name in fig.names():
        figures = fig.load(name)
        if figures.plot is not None:
            plots.draw(name, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
