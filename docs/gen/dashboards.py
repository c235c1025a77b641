"""Images of the Grafana dashboards, drawn from their committed JSON and a real run's Prometheus data.

No Grafana is involved: each panel's own queries (``targets[].expr``) are evaluated with Prometheus's
``/api/v1/query_range`` over the run's time span and drawn with matplotlib where the panel's
``gridPos`` puts it, a timeseries as lines labelled by its ``legendFormat``, a stat as its last
value. The images are renderings, and say so in their title.

Regenerate them from a finished ``relayrl up --monitor`` run::

    .venv/bin/python -m docs.gen.dashboards runs/<id>

That starts a ``prometheus`` (from PATH) on a copy of the run's TSDB (``runs/<id>/prometheus/data``),
scraping nothing, and writes ``docs/figures/dashboard-<name>.png`` for each
``deploy/helm/relayrl/dashboards/relayrl-<name>.json``. ``--prometheus URL`` queries a Prometheus
that is already up (the one a ``--keep-alive`` run prints) instead. ``python -m docs.gen`` does not
run this: it needs a run, and the Operate page embeds whichever images exist.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import matplotlib
import yaml

from relayrl import http_client

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter
from PIL import Image

from docs.gen import figures as fig
from docs.gen.ops import DASHBOARDS, image_of
from relayrl.net import free_port

COMMAND = ".venv/bin/python -m docs.gen.dashboards RUN_DIR"
GRID_COLUMNS = 24  # Grafana's grid is 24 columns wide; a row unit is about 30 px
WIDTH_IN = 13.0
ROW_UNIT_IN = 0.2
DPI = 80
COLOURS = 128
POINTS = 240  # samples per series over the run: the step is the span over this
DEFAULT_SCRAPE_S = 15.0


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict[str, str]
    times_s: list[float]
    values: list[float]


@dataclass(frozen=True, slots=True)
class Span:
    start_s: float
    end_s: float
    step_s: float
    scrape_s: float


@dataclass(frozen=True, slots=True)
class Drawn:
    """What one panel became: its title, its type and how many series it drew (0: "No data")."""

    title: str
    kind: str
    series: int
    error: str = ""


Fetch = Callable[[str], list[Series]]


def substitute(expr: str, span: Span) -> str:
    """The query with Grafana's variables replaced by what Grafana would send for this span.

    ``$__rate_interval`` is Grafana's max(interval + scrape interval, 4 × scrape interval).
    """
    rate = max(span.step_s + span.scrape_s, 4 * span.scrape_s)
    values = {
        "__rate_interval": f"{math.ceil(rate)}s",
        "__interval": f"{math.ceil(span.step_s)}s",
        "__range": f"{math.ceil(span.end_s - span.start_s)}s",
    }

    def one(match: re.Match[str]) -> str:
        name = match["braced"] or match["bare"]
        if name not in values:
            raise ValueError(f"query uses the variable ${name}, which the renderer does not know: {expr}")
        return values[name]

    return re.sub(r"\$(?:\{(?P<braced>\w+)\}|(?P<bare>\w+))", one, expr)


def legend(fmt: str | None, labels: dict[str, str]) -> str:
    """Grafana's legend: ``{{label}}`` filled in, or the label set when the target has no format."""
    if fmt and fmt != "__auto":
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest or not name else name


def parse_matrix(payload: dict) -> list[Series]:
    """Prometheus's ``query_range`` answer as series; NaN and infinities are dropped, as Grafana does."""
    if payload.get("status") != "success":
        raise ValueError(payload.get("error", "query failed"))
    found = []
    for item in payload["data"]["result"]:
        points = [(float(t), float(v)) for t, v in item.get("values", [])]
        points = [(t, v) for t, v in points if math.isfinite(v)]
        if points:
            times, values = zip(*points, strict=True)
            found.append(Series(dict(item.get("metric", {})), list(times), list(values)))
    return found


class Prometheus:
    """The HTTP API of one Prometheus: the run's span and range queries."""

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = client or http_client.client(timeout=30.0)

    def span(self, scrape_s: float, earliest_s: float | None = None) -> Span:
        """The head block's time range, from ``earliest_s`` (the oldest persisted block's start) when
        given, with a step of about POINTS samples."""
        head = self.client.get(f"{self.url}/api/v1/status/tsdb").json()["data"]["headStats"]
        start_s, end_s = head["minTime"] / 1000, head["maxTime"] / 1000
        if earliest_s is not None:
            start_s = min(start_s, earliest_s)
        if not (0 < start_s < end_s):
            raise ValueError(f"{self.url} holds no samples (head block {head['minTime']}..{head['maxTime']} ms)")
        step = max(scrape_s, math.ceil((end_s - start_s) / POINTS))
        return Span(start_s, end_s, step, scrape_s)

    def query_range(self, expr: str, span: Span) -> list[Series]:
        answer = self.client.get(
            f"{self.url}/api/v1/query_range",
            params={"query": expr, "start": span.start_s, "end": span.end_s, "step": span.step_s},
        )
        return parse_matrix(answer.json())


@contextlib.contextmanager
def serve(data_dir: Path, ready_timeout_s: float = 120.0) -> Iterator[str]:
    """A ``prometheus`` scraping nothing, on a copy of ``data_dir`` (the run's TSDB stays untouched)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is not on PATH (apt-get install prometheus)")
    with tempfile.TemporaryDirectory(prefix="relayrl-dashboards-") as tmp:
        copy = Path(tmp) / "data"
        shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns("lock"))
        config = Path(tmp) / "prometheus.yml"
        config.write_text("global: {}\n")
        log = Path(tmp) / "prometheus.log"
        url = f"http://127.0.0.1:{free_port()}"
        with log.open("w") as err:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={copy}",
                    f"--web.listen-address={url.removeprefix('http://')}",
                    "--storage.tsdb.retention.time=100y",  # keep an old run's samples
                    "--log.level=warn",
                ],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if http_client.get(f"{url}/-/ready", timeout=2.0).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    tail = log.read_text()[-2000:]
                    raise RuntimeError(f"prometheus on a copy of {data_dir} did not become ready:\n{tail}")
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def scrape_interval_s(run_dir: Path) -> float:
    """The run's scrape interval, from the config ``relayrl up --monitor`` wrote."""
    config = run_dir / "prometheus" / "prometheus.yml"
    if not config.is_file():
        return DEFAULT_SCRAPE_S
    text = str(yaml.safe_load(config.read_text()).get("global", {}).get("scrape_interval", ""))
    match = re.fullmatch(r"(\d+(?:\.\d+)?)s", text)
    return float(match[1]) if match else DEFAULT_SCRAPE_S


_SCALES = {
    "bytes": (1024, ["B", "KiB", "MiB", "GiB", "TiB"]),
    "Bps": (1024, ["B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"]),
    "gbytes": (1024, ["GB", "TB"]),
}


def format_value(value: float, unit: str | None) -> str:
    """A value as Grafana's unit would show it, briefly."""
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "s":
        if value and abs(value) < 1:
            return f"{value * 1000:.3g} ms"
        return f"{value:.3g} s"
    if unit == "ops":
        return f"{value:.3g} ops/s"
    if unit in _SCALES:
        base, names = _SCALES[unit]
        k = 0
        while abs(value) >= base and k < len(names) - 1:
            value, k = value / base, k + 1
        return f"{value:.3g} {names[k]}"
    if abs(value) >= 1e3:
        for scale, suffix in ((1e9, " B"), (1e6, " M"), (1e3, " K")):
            if abs(value) >= scale:
                return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def panels(board: dict) -> list[dict]:
    """Every panel in grid order, rows included, with those nested in collapsed rows."""
    found = []
    for panel in board.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def _fetch_all(panel: dict, fetch: Fetch) -> tuple[list[tuple[str, Series]], str]:
    drawn, errors = [], []
    for target in panel.get("targets", []):
        if not target.get("expr") or target.get("hide"):
            continue
        try:
            found = fetch(target["expr"])
        except (ValueError, httpx.HTTPError) as error:
            errors.append(str(error))
            continue
        drawn.extend((legend(target.get("legendFormat"), s.labels), s) for s in found)
    return drawn, "; ".join(errors)


def _draw_timeseries(ax: plt.Axes, series: list[tuple[str, Series]], defaults: dict, start_s: float) -> None:
    unit = defaults.get("unit")
    for label, s in series:
        ax.plot([(t - start_s) / 60 for t in s.times_s], s.values, linewidth=1, label=label or " ")
    if "min" in defaults:
        ax.set_ylim(bottom=defaults["min"])
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_value(v, unit)))
    ax.tick_params(labelsize=6, pad=1)
    ax.grid(alpha=0.3)
    ax.set_xlabel("minutes into the run", fontsize=6, labelpad=1)
    if any(label for label, _ in series):
        ax.legend(fontsize=6.5, loc="best", framealpha=0.6, ncol=2 if len(series) > 4 else 1)


def _draw_stat(ax: plt.Axes, series: list[tuple[str, Series]], unit: str | None, start_s: float) -> None:
    """The last value of each series (Grafana's lastNotNull), over a faint sparkline."""
    ax.set_axis_off()
    ax.set_xlim(0, 1)
    for i, (label, s) in enumerate(series[:4]):
        y = 0.45 if len(series) == 1 else 0.8 - 0.6 * i / max(1, min(len(series), 4) - 1)
        text = format_value(s.values[-1], unit)
        ax.text(
            0.5,
            y,
            f"{label}: {text}" if len(series) > 1 else text,
            ha="center",
            va="center",
            fontsize=16 if len(series) == 1 else 8,
            fontweight="bold",
            color="#1f6f3f",
            transform=ax.transAxes,
        )
    spark = ax.inset_axes((0, 0, 1, 0.35))
    spark.set_axis_off()
    for _, s in series[:4]:
        spark.fill_between([t - start_s for t in s.times_s], s.values, alpha=0.15, color="#1f6f3f")


def render(board: dict, fetch: Fetch, span: Span, out: Path, source: str = "") -> list[Drawn]:
    """Draws ``board`` (a dashboard's JSON) into ``out``, one axes per panel at its grid position."""
    items = panels(board)
    height = max((p["gridPos"]["y"] + p["gridPos"]["h"] for p in items), default=1)
    title_in = 0.45
    total_in = height * ROW_UNIT_IN + title_in
    figure = plt.figure(figsize=(WIDTH_IN, total_in), dpi=DPI)
    figure.suptitle(
        f"{board.get('title', '')}: a rendering of the dashboard's queries, not a Grafana screenshot"
        + (f" ({source})" if source else ""),
        fontsize=10,
        y=1 - 0.12 / total_in,
    )
    drawn = []
    for panel in items:
        grid = panel["gridPos"]
        left = grid["x"] / GRID_COLUMNS
        width = grid["w"] / GRID_COLUMNS
        top = 1 - (title_in + grid["y"] * ROW_UNIT_IN) / total_in
        cell_h = grid["h"] * ROW_UNIT_IN / total_in
        if panel.get("type") == "row":
            figure.text(0.005, top - cell_h / 2, panel.get("title", ""), fontsize=9, fontweight="bold", va="center")
            continue
        # Margins inside the cell for the title, tick labels and the axis label.
        pad_x, pad_top, pad_bottom = 0.6 / WIDTH_IN, 0.24 / total_in, 0.32 / total_in
        is_stat = panel.get("type") in ("stat", "gauge")
        if is_stat:
            pad_x, pad_bottom = 0.006, 0.05 / total_in
        ax = figure.add_axes(
            (left + pad_x, top - cell_h + pad_bottom, width - pad_x - 0.006, cell_h - pad_top - pad_bottom)
        )
        ax.set_title(panel.get("title", ""), fontsize=7.5, loc="left", pad=2)
        series, error = _fetch_all(panel, fetch)
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if not series:
            ax.set_xticks([])
            ax.set_yticks([])
            message = "query failed" if error else "No data"
            ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes)
        elif is_stat:
            _draw_stat(ax, series, defaults.get("unit"), span.start_s)
        else:
            _draw_timeseries(ax, series, defaults, span.start_s)
        drawn.append(Drawn(panel.get("title", ""), panel.get("type", ""), len(series), error))
    _save(figure, out)
    return drawn


def _save(figure: plt.Figure, out: Path) -> None:
    """A PNG of at most COLOURS colours: a tall dashboard stays well under 300 KB."""
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI, format="png")
    plt.close(figure)
    buffer.seek(0)
    image = Image.open(buffer).convert("RGB").quantize(colors=COLOURS, dither=Image.Dither.NONE)
    out.parent.mkdir(parents=True, exist_ok=True)
    image.save(out, optimize=True)


def earliest_block_s(data_dir: Path) -> float | None:
    """Start of the oldest block Prometheus persisted (a run longer than about 3 h has some)."""
    starts = [json.loads(meta.read_text())["minTime"] / 1000 for meta in data_dir.glob("*/meta.json")]
    return min(starts, default=None)


def render_all(
    url: str, scrape_s: float, out_dir: Path = fig.FIGURES, source: str = "", earliest_s: float | None = None
) -> dict[Path, list[Drawn]]:
    """Every committed dashboard, each to ``out_dir/dashboard-<name>.png``."""
    prometheus = Prometheus(url)
    span = prometheus.span(scrape_s, earliest_s)
    done = {}
    for path in sorted(DASHBOARDS.glob("relayrl-*.json")):
        board = json.loads(path.read_text())
        out = out_dir / image_of(path).name
        done[out] = render(board, lambda expr: prometheus.query_range(substitute(expr, span), span), span, out, source)
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.gen.dashboards", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="A `relayrl up --monitor` run: runs/<id>.")
    parser.add_argument("--prometheus", help="Query this Prometheus URL instead of one started on the run's TSDB.")
    parser.add_argument("--out", type=Path, default=fig.FIGURES, help="Where to write dashboard-<name>.png.")
    args = parser.parse_args(argv)
    scrape_s = scrape_interval_s(args.run_dir)
    source = f"run {args.run_dir.resolve().name}"
    data = args.run_dir / "prometheus" / "data"
    with contextlib.ExitStack() as stack:
        url = args.prometheus
        if url is None:
            if not data.is_dir():
                print(f"{data} does not exist: was {args.run_dir} started with `relayrl up --monitor`?")
                return 1
            url = stack.enter_context(serve(data))
        earliest = earliest_block_s(data) if data.is_dir() else None
        for out, drawn in render_all(url, scrape_s, args.out, source, earliest).items():
            empty = [d.title for d in drawn if not d.series]
            failed = [f"{d.title}: {d.error}" for d in drawn if d.error]
            print(f"wrote {out} ({len(drawn)} panels, {len(empty)} without data)")
            for line in failed:
                print(f"  query failed: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
