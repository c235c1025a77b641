"""The docs hold only what code and measurements hold: generated references and figure blocks are
fresh, every measured figure comes from a file under docs/benchmarks/, and the journeys a new user
takes start on the docs home."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docs.gen import blocks, prose, settings_ref
from docs.gen import figures as fig
from docs.gen.__main__ import COMMAND, PAGES, stale

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_generated_pages_are_fresh() -> None:
    found = stale()
    assert found == [], f"stale generated docs: {', '.join(found)}; regenerate with `{COMMAND}` and commit them"


@pytest.mark.parametrize("name", fig.names())
def test_each_figures_file_says_how_it_was_measured(name: str) -> None:
    figures = fig.load(name)
    page = figures.page.partition("#")[0]
    assert (DOCS / page).is_file(), f"docs/benchmarks/{name}.json names page {page}, which does not exist"
    flat = [fig.flatten(run.output) for run in figures.runs]
    assert all(flat), f"docs/benchmarks/{name}.json: a run without a scalar figure"
    if figures.headline:
        assert figures.headline_text()
    if figures.plot:
        run = figures.run()
        keys = [*figures.plot.keys, *([figures.plot.x] if figures.plot.x else [])]
        missing = [key for key in keys if _lookup(run.output, key) is None]
        assert missing == [], f"docs/benchmarks/{name}.json plots keys its output lacks: {missing}"


def _lookup(output: dict, key: str) -> object:
    value: object = output
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_a_figures_file_without_its_machine_is_refused() -> None:
    data = json.loads((fig.BENCHMARKS / "e2e-realistic.json").read_text())
    del data["machine"]["gpu"]
    with pytest.raises(ValueError, match="gpu"):
        fig.FiguresFile.model_validate(data)


# The generated references hold what the code says (defaults, descriptions), not measurements.
WRITTEN_PAGES = [page for page in blocks.pages() if page not in PAGES]


@pytest.mark.parametrize("page", WRITTEN_PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_states_a_measured_figure_outside_a_block(page: Path) -> None:
    found = prose.measured_figures(page.read_text())
    assert found == [], (
        f"{page.relative_to(ROOT)} types measured figures into its text; put them in docs/benchmarks/<name>.json"
        f" and show them with a generated block (docs/gen/blocks.py): {found}"
    )


@pytest.mark.parametrize(
    ("text", "figure"),
    [
        ("the async mode ran at 81.2 samples/s here", True),
        ("bf16 made the trainer 2.4× faster", True),
        ("a 2x gain", True),
        ("the engine idled 12.4 % of the time", True),
        ("reward 0.007 → 0.995 over the run", True),
        ("the target is speedup ≥ 2×", False),
        ("16 prompts × 8 samples, 4 × 8-GPU trainer", False),
        ("set `RELAYRL_ENGINE_PREFIX_CACHE_MB=0` or `--speedup 1.5x`", False),
        ("```text\nsamples/s 81.2 → 90 %\n```\n", False),
        ("<!-- generated: figures e2e-toy -->\n| speedup | 1.5× |\n<!-- end generated -->", False),
    ],
)
def test_the_figure_rule(text: str, figure: bool) -> None:
    assert bool(prose.measured_figures(text)) is figure


def test_a_stale_block_is_refilled_from_its_file(tmp_path: Path) -> None:
    page = DOCS / "benchmarks.md"
    typed = "<!-- generated: headline e2e-realistic -->\n**a speedup typed by hand**\n<!-- end generated -->\n"
    filled = blocks.fill(typed, page)
    assert "typed by hand" not in filled
    assert fig.load("e2e-realistic").headline_text() in filled
    assert fig.load("e2e-realistic").command in filled


def test_the_readme_is_short_and_renders_its_claims_from_the_files() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    claims = [fig.load(name) for name in fig.names() if fig.load(name).headline]
    assert claims and all(f.headline_text() in readme for f in claims)


def _links(page: Path) -> set[str]:
    return {target.partition("#")[0] for target in re.findall(r"\]\(([^)]+)\)", page.read_text())}


@pytest.mark.parametrize(
    ("journey", "page", "must_say"),
    [
        ("train on my own parquet with my own reward function", "train-on-your-data.md", ["parquet", "compute_score"]),
        ("deploy with Helm on a GPU cluster", "deploy-kubernetes.md", ["helm install", "n_gpus_per_node"]),
        ("pause and resume a run from the control API", "operate.md", ["/control/pause", "/control/resume"]),
        ("read the current end-to-end figures with their command", "benchmarks.md", ["relayrl bench e2e"]),
    ],
)
def test_each_user_journey_is_one_click_from_the_docs_home(journey: str, page: str, must_say: list[str]) -> None:
    assert page in _links(DOCS / "index.md"), f"the docs home does not link {page} ({journey})"
    text = (DOCS / page).read_text()
    assert [phrase for phrase in must_say if phrase not in text] == [], journey


def test_the_configuration_reference_lists_every_variable_with_the_names_users_know() -> None:
    page = settings_ref.render()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines() if line.startswith("| `RELAYRL_")}
    for cls in settings_ref.settings_classes():
        for name in cls.model_fields:
            assert settings_ref.env_var_name(cls, name) in rows, f"{cls.__name__}.{name} is missing"
    assert "verl: `max_queue_size`" in rows["RELAYRL_QUEUE_CAPACITY"]
    assert "SGLang: `max_prefill_tokens`" in rows["RELAYRL_ENGINE_MAX_PREFILL_TOKENS"]
    assert "`trainer.batch_size`" in rows["RELAYRL_TRAINER_BATCH_SIZE"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (900.0, "900"),
        (28876.0, "28,876"),
        (1.0, "1.0"),
        (0.25, "0.25"),
        (1500, "1,500"),
        (48747.48, "48,747.48"),
        (999.5, "999.5"),
        (None, "–"),
        (True, "yes"),
    ],
)
def test_figures_are_shown_as_a_reader_expects(value: object, shown: str) -> None:
    # A whole duration or count reads as one ("42 faults in 900 s"); a ratio keeps its decimal.
    assert fig.show(value) == shown
