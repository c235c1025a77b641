"""Structure of the service image (docker cannot build here, so its Dockerfile is checked as text)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from typer.testing import CliRunner

from commands.cli import app

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
TEMPLATES = REPO / "deploy" / "helm" / "relayrl" / "templates"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def build_args() -> dict[str, str]:
    return dict(arg.split("=", 1) for op, arg in instructions() if op == "ARG" and "=" in arg)


def test_base_images_are_pinned_to_exact_versions() -> None:
    args = build_args()
    bases = [arg.split()[0] for op, arg in instructions() if op == "FROM"]
    assert len(bases) == 2  # a build stage and a slim runtime stage
    for base in bases:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
        name, _, tag = image.partition(":")
        assert name and re.fullmatch(r"\d+\.\d+\.\d+-[a-z-]+", tag), f"unpinned base image {image!r}"


def test_runtime_stage_runs_as_the_charts_non_root_user() -> None:
    ops = instructions()
    last_from = max(i for i, (op, _) in enumerate(ops) if op == "FROM")
    users = [arg for op, arg in ops[last_from:] if op == "USER"]
    assert users == ["10001:10001"]
    values = yaml.safe_load((REPO / "deploy" / "helm" / "relayrl" / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001 and values["podSecurityContext"]["runAsNonRoot"]


def test_image_torch_is_the_cpu_setups_pin_and_the_rest_is_constrained() -> None:
    # The exact torch lives in `make setup` (pyproject.toml holds a range a GPU host's own torch meets).
    torch = build_args()["TORCH_VERSION"]
    assert f"torch=={torch}" in (REPO / "Makefile").read_text()
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (wanted,) = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "torch"]
    assert wanted.specifier.contains(torch)
    installs = [arg for op, arg in instructions() if op == "RUN" and arg.startswith("pip install") and " ." in arg]
    assert installs and all("-c constraints.txt" in arg for arg in installs)


def test_copied_sources_exist_and_pass_the_dockerignore() -> None:
    ignore = (DOCKERFILE.parent / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    for op, arg in instructions():
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (REPO / source).exists() and source in allowed, source


def test_chart_images_are_pinned() -> None:
    values = yaml.safe_load((REPO / "deploy" / "helm" / "relayrl" / "values.yaml").read_text())
    assert re.fullmatch(r"7\.\d+\.\d+", values["redis"]["image"]["tag"])
    assert re.fullmatch(r"v\d+\.\d+\.\d+(\.post\d+)?-cu\d+", values["rollout"]["engine"]["sglang"]["image"]["tag"])


def chart_commands() -> set[tuple[str, ...]]:
    """Every `relayrl ...` command line the chart's containers run."""
    found: set[tuple[str, ...]] = set()
    for template in [*TEMPLATES.glob("*.yaml"), *TEMPLATES.glob("*.tpl")]:
        for match in re.finditer(r'command: \["relayrl", ([^\]]*)\]', template.read_text()):
            words = [w.strip().strip('"') for w in match.group(1).split(",")]
            found.add(tuple(w for w in words if not w.startswith("{{")))
    if "- relayrl\n            - trainer\n            - run" in (TEMPLATES / "trainer.yaml").read_text():
        found.add(("trainer", "run"))
    return found


def test_every_command_the_chart_runs_exists() -> None:
    commands = chart_commands()
    assert {("queue", "serve"), ("rollout", "serve"), ("paramsync", "serve"), ("engine", "serve")} <= commands
    assert ("trainer", "run") in commands and ("model", "init-tiny") in commands
    for command in commands:
        result = CliRunner().invoke(app, [*command, "--help"])
        assert result.exit_code == 0, f"relayrl {' '.join(command)}: {result.output}"
