"""What an install without an optional extra does: each feature that needs one stops with one line
naming the extra (``pip install 'relayrl[...]'``), and nothing else needs it."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from relayrl.extras import MissingExtra

REPO = Path(__file__).resolve().parents[2]
CALL = re.compile(r'require\(\s*"([\w.]+)",\s*"(\w+)"')
# Import names that differ from the name of the distribution that installs them.
DISTRIBUTIONS = {"pynvml": "nvidia-ml-py"}


def _missing(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    """As if ``modules`` were not installed (a None entry makes their import fail as a missing one)."""
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def _one_line(err: pytest.ExceptionInfo[MissingExtra], extra: str) -> str:
    message = str(err.value)
    assert "\n" not in message and f"pip install 'relayrl[{extra}]'" in message
    return message


def test_every_extra_the_code_names_exists_and_installs_that_package() -> None:
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    calls = {
        (module.partition(".")[0], extra)
        for folder in ("relayrl", "services", "commands")
        for path in (REPO / folder).rglob("*.py")
        for module, extra in CALL.findall(path.read_text())
    }
    assert {extra for _, extra in calls} >= {"trackers", "k8s", "plots", "parquet", "gpu"}
    for package, extra in calls:
        names = {re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0].lower() for line in optional[extra]}
        assert DISTRIBUTIONS.get(package, package) in names, f"relayrl[{extra}] does not install {package}"
    # `make setup` installs `all`: every extra the code names is in it.
    assert {extra for _, extra in calls} <= set(re.findall(r"\w+", optional["all"][0].partition("[")[2]))


def test_a_parquet_dataset_without_pyarrow_names_the_parquet_extra(monkeypatch, tmp_path) -> None:
    from services.trainer.data import read_rows

    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1")
    _missing(monkeypatch, "pyarrow", "pyarrow.parquet")
    with pytest.raises(MissingExtra) as err:
        read_rows(str(data), size=4, difficulty=1, seed=0, split="train")
    assert str(data) in _one_line(err, "parquet")


@pytest.mark.parametrize(("tracker", "package"), [("tensorboard", "tensorboard"), ("wandb", "wandb")])
def test_a_tracker_without_its_package_stops_the_trainer_at_start(monkeypatch, tmp_path, tracker, package) -> None:
    from services.trainer.loggers import build_loggers

    _missing(monkeypatch, package)
    with pytest.raises(MissingExtra) as err:
        build_loggers([tracker], tmp_path, "project", "run", {})
    assert f"trainer.logger {tracker}" in _one_line(err, "trackers")


def test_kubernetes_discovery_without_the_client_names_the_k8s_extra(monkeypatch) -> None:
    from services.paramsync.config import ParamSyncSettings
    from services.paramsync.server import create_discovery

    _missing(monkeypatch, "kubernetes", "services.paramsync.discovery_k8s")
    with pytest.raises(MissingExtra) as err:
        create_discovery(ParamSyncSettings(discovery="kubernetes", k8s_namespace="relayrl"))
    assert "RELAYRL_PARAMSYNC_DISCOVERY=kubernetes" in _one_line(err, "k8s")


def test_the_relayrl_command_says_the_missing_extra_in_one_line(monkeypatch, capsys, tmp_path) -> None:
    from commands.cli import main

    _missing(monkeypatch, "matplotlib", "matplotlib.pyplot")
    monkeypatch.setattr(
        sys, "argv", ["relayrl", "bench", "compare", "--runs", f"a={tmp_path}", "--runs", f"b={tmp_path}"]
    )
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("relayrl: bench compare's figure needs matplotlib") and "relayrl[plots]" in err


def test_a_run_report_without_matplotlib_draws_no_figure_and_says_why(monkeypatch, tmp_path) -> None:
    from commands.stack.report import plot_reward

    _missing(monkeypatch, "matplotlib", "matplotlib.pyplot")
    with pytest.raises(MissingExtra) as err:
        plot_reward([], "reward", 0.0, tmp_path / "reward.png")
    assert "reward.png" in _one_line(err, "plots")
    assert not (tmp_path / "reward.png").exists()
