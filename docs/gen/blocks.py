"""Figure blocks: the parts of a Markdown page that the generator owns.

A block is written in a page as::

    <!-- generated: figures e2e-toy -->
    (anything: the generator replaces it)
    <!-- end generated -->

and holds one of

- ``figures NAME``: docs/benchmarks/NAME.json as a table (one row per figure of the bench's
  output, one column per run), with its command, machine, date and plot;
- ``headline NAME``: that file's headline figure on one line, with its command;
- ``claims``: the README's table, one row per file with a headline: what RelayRL does, the
  figure, the page;
- ``dashboards`` and ``alerts``: the chart's Grafana dashboards (panel by panel) and alert rules.

Every number inside a block comes from a JSON file; :func:`docs.gen.prose.measured_figures`
keeps numbers of that kind out of the text around the blocks.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from docs.gen import figures as fig
from docs.gen import ops

ROOT = fig.DOCS.parent
BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<kind>[a-z]+)(?: (?P<arg>[\w.-]+))? -->\n)"
    r"(?P<body>.*?)(?P<close><!-- end generated -->)",
    re.S,
)


class BlockError(ValueError):
    """A block names a kind or a file that does not exist."""


def pages() -> list[Path]:
    """Every page that may hold blocks: the README and the docs site's Markdown."""
    return [ROOT / "README.md", *sorted(fig.DOCS.rglob("*.md"))]


def _link(page: Path, target: Path) -> str:
    return Path(os.path.relpath(target, page.parent)).as_posix()


def _page_link(page: Path, docs_page: str) -> str:
    path, _, anchor = docs_page.partition("#")
    return _link(page, fig.DOCS / path) + (f"#{anchor}" if anchor else "")


def render(kind: str, arg: str | None, page: Path) -> str:
    if kind == "figures" and arg:
        figures = fig.load(arg)
        parts = [fig.provenance(figures, _link(page, fig.BENCHMARKS / f"{arg}.json")), fig.table(figures)]
        if figures.plot is not None:
            parts.append(f"![{figures.title}]({_link(page, fig.FIGURES / f'bench-{arg}.png')})")
        return "\n\n".join(parts) + "\n"
    if kind == "headline" and arg:
        figures = fig.load(arg)
        run = figures.run(figures.headline.run if figures.headline else "")
        text = figures.headline_text() if figures.headline else figures.title
        return (
            f"**{text}.** Measured: {run.statistic}; `{run.command or figures.command}`; {figures.machine.cpu},"
            f" {figures.machine.cores} cores, {figures.machine.gpu or 'no GPU'}; {figures.date.isoformat()}"
            f" ([all figures]({_page_link(page, figures.page)})).\n"
        )
    if kind == "claims":
        rows = []
        files = [fig.load(name) for name in fig.names()]
        for figures in sorted((f for f in files if f.headline), key=lambda f: f.headline.order):
            rows.append(
                f"| {figures.headline.claim} | {figures.headline_text()} | [{figures.title}]"
                f"({_page_link(page, figures.page)}) |"
            )
        head = "| what it does | current figure | read more |\n| --- | --- | --- |"
        return "\n".join([head, *rows]) + "\n"
    if kind == "dashboards":
        return ops.dashboards(page)
    if kind == "alerts":
        return ops.alerts(page)
    raise BlockError(f"{page.relative_to(ROOT)}: unknown block '{kind} {arg or ''}'".rstrip())


def fill(text: str, page: Path) -> str:
    """The page with every block rendered afresh."""

    def one(match: re.Match[str]) -> str:
        body = render(match["kind"], match["arg"], page)
        return match["open"] + body + match["close"]

    return BLOCK.sub(one, text)


def outside_blocks(text: str) -> str:
    """The page's own text: every block's body left out."""
    return BLOCK.sub(lambda m: m["open"] + m["close"], text)
