"""``relayrl check`` and the check ``relayrl up`` runs first: every bad-config case is one
block naming the YAML key or file, exit code 2, before anything starts."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from commands.stack.check import ConfigError, load_checked

REPO = Path(__file__).resolve().parents[3]
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
ROW = (
    '{"prompt": [{"role": "user", "content": "2+2?"}], "data_source": "mine", "reward_model": {"ground_truth": "4"}}\n'
)


def _problems(tmp_path: Path, text: str) -> str:
    path = tmp_path / "stack.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_checked(path)
    message = str(info.value)
    assert message.startswith(f"{path}: invalid config")
    return message


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param(
            "trainer:\n  batchsize: 8\n",
            ["trainer.batchsize: unknown setting; did you mean trainer.batch_size?"],
            id="a misspelled key, with the closest name",
        ),
        pytest.param(
            "trainr:\n  total_steps: 5\nstack:\n  rollout_replica: 2\n",
            [
                "trainr: unknown section; did you mean trainer?",
                "stack.rollout_replica: unknown setting; did you mean stack.rollout_replicas?",
            ],
            id="misspelled sections and stack keys",
        ),
        pytest.param(
            "trainer:\n  sync_every: 2\n  save_freq: 3\n",
            ["trainer: save_freq (3) must be a multiple of sync_every (2)"],
            id="a cross-field rule, by its section",
        ),
        pytest.param(
            "rollout:\n  reward_function: no_such_reward_mod:compute_score\n",
            ["No module named 'no_such_reward_mod'", "custom_reward_function: {path:"],
            id="an unimportable module reward, suggesting the file form",
        ),
        pytest.param(
            "trainer:\n  lora_rank: 8\n  lora_alpha: 32\n",
            ["rollout.lora_alpha (16) must equal trainer.lora_alpha (32)"],
            id="a LoRA trainer's alpha that the rollouts would not load its versions with",
        ),
    ],
)
def test_each_problem_is_named(tmp_path, text, named):
    message = _problems(tmp_path, text)
    for part in named:
        assert part in message


def test_a_bad_value_names_the_yaml_key_and_the_allowed_range(tmp_path):
    message = _problems(tmp_path, "trainer:\n  batch_size: -4\nrollout:\n  partial_rollout_mode: sometimes\n")
    assert "trainer.batch_size: Input should be greater than or equal to 1 (got -4)" in message
    assert "rollout.partial_rollout_mode:" in message and "'sometimes'" in message
    assert "RELAYRL_" not in message


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    message = _problems(tmp_path, "trainer:\n  total_steps: [1\n  lr: 3\n")
    assert "YAML syntax error at line 3" in message
    assert "<unicode string>" not in message and len(message.splitlines()) == 2


def test_a_missing_or_unparsable_dataset_is_reported(tmp_path):
    message = _problems(tmp_path, "trainer:\n  dataset: data/train.parquet\n")
    assert f"trainer.dataset: dataset '{tmp_path / 'data' / 'train.parquet'}' is neither" in message
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert "trainer.val_dataset:" in _problems(tmp_path, "trainer:\n  val_dataset: bad.jsonl\n")
    (tmp_path / "noprompt.jsonl").write_text('{"question": "2+2?"}\n')
    assert "no 'prompt' field" in _problems(tmp_path, "trainer:\n  dataset: noprompt.jsonl\n")


def test_reward_files_that_do_not_import_or_do_not_fit_are_reported(tmp_path):
    (tmp_path / "broken.py").write_text("def compute_score(\n")
    message = _problems(tmp_path, "custom_reward_function: {path: broken.py}\n")
    assert f"custom_reward_function.path: {tmp_path / 'broken.py'} line 1: '(' was never closed" in message
    (tmp_path / "narrow.py").write_text("def score(text):\n    return 0.0\n")
    message = _problems(tmp_path, "custom_reward_function: {path: narrow.py, name: score}\n")
    assert "must accept compute_score(data_source, solution_str, ground_truth, extra_info=None)" in message


def test_a_lora_config_with_one_alpha_passes(tmp_path):
    path = tmp_path / "stack.yaml"
    path.write_text("trainer:\n  lora_rank: 8\n  lora_alpha: 32\nrollout:\n  lora_alpha: 32\n")
    assert load_checked(path).rollout["lora_alpha"] == 32


def test_a_fixed_port_in_use_is_reported(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        message = _problems(tmp_path, f"paramsync:\n  data_port: {port}\n")
    assert f"paramsync.data_port: port {port} is in use" in message


def test_verl_reward_file_and_dataset_resolve_against_the_config_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "my_reward.py").write_text(REWARD)
    (folder / "train.jsonl").write_text(ROW)
    (folder / "stack.yaml").write_text(
        "custom_reward_function: {path: my_reward.py, name: compute_score}\ntrainer:\n  dataset: train.jsonl\n"
    )
    monkeypatch.chdir(tmp_path)  # run from elsewhere: paths still resolve against the file
    config = load_checked(Path("project/stack.yaml"))
    assert config.rollout["reward_function"] == f"{folder / 'my_reward.py'}:compute_score"
    assert config.trainer["dataset"] == str(folder / "train.jsonl")
    env = config.section_env("rollout")
    assert env["RELAYRL_ROLLOUT_REWARD_FUNCTION"].endswith("project/my_reward.py:compute_score")


def test_the_reward_file_form_scores_in_the_rollout(tmp_path):
    from services.rollout.rewards.registry import resolve_reward

    (tmp_path / "my_reward.py").write_text(REWARD.replace("1.0", "float(solution_str == ground_truth)"))
    fn = resolve_reward(f"{tmp_path / 'my_reward.py'}:compute_score")
    assert fn("mine", "4", "4") == 1.0 and fn("mine", "5", "4") == 0.0


def test_up_with_a_bad_config_exits_2_fast_and_starts_nothing(tmp_path):
    runs = tmp_path / "runs"
    path = tmp_path / "stack.yaml"
    path.write_text(f"stack:\n  runs_dir: {runs}\n  run_id: r\ntrainer:\n  batchsize: 8\n")
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--config", str(path)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "trainer.batchsize: unknown setting; did you mean trainer.batch_size?" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 2
    assert not runs.exists(), "a run directory means the stack started"


def test_up_with_a_model_dir_that_is_no_model_exits_2_on_one_line_and_starts_nothing(tmp_path):
    runs = tmp_path / "runs"
    path = tmp_path / "stack.yaml"
    path.write_text(f"stack:\n  runs_dir: {runs}\n  run_id: r\n")
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "up", "--config", str(path), "--model-dir", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == (
        f"--model-dir: {tmp_path} is not a model directory (no config.json);"
        f" create one with `relayrl model init-tiny {tmp_path}`"
    )
    assert not runs.exists(), "a run directory means the stack started"


def test_the_check_imports_no_torch(tmp_path):
    # Importing torch takes seconds; the check must answer before a user wonders.
    path = tmp_path / "stack.yaml"
    path.write_text("trainer:\n  total_steps: 3\n")
    code = (
        "import sys, pathlib; from commands.stack.check import load_checked;"
        f" load_checked(pathlib.Path({str(path)!r})); print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_a_logger_list_passes_the_check_and_reaches_the_trainer_through_its_env(tmp_path, monkeypatch):
    from relayrl.config import load_settings
    from services.trainer.config import TrainerSettings

    path = tmp_path / "stack.yaml"
    path.write_text("trainer:\n  logger: [console, tensorboard]\n  save_hf_model: true\n")
    env = load_checked(path).section_env("trainer")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(TrainerSettings)
    assert settings.logger == ["console", "tensorboard"] and settings.save_hf_model

    message = _problems(tmp_path, "trainer:\n  logger: [console, tensorbord]\n")
    assert "trainer.logger: Input should be 'console', 'tensorboard' or 'wandb' (got 'tensorbord')" in message


TOOL = """
from services.rollout.agent.tools import BaseTool


class Multiply(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return str(int(parameters["a"]) * int(parameters["b"])), 0.0, {}
"""
TOOL_CONFIG = """
tools:
  - class_name: {class_name}
    config: {{}}
    tool_schema:
      type: function
      function:
        name: multiply
        description: Multiplies a and b.
        parameters: {{type: object, properties: {{a: {{type: integer}}, b: {{type: integer}}}}, required: [a, b]}}
"""
AGENT = "rollout:\n  multi_turn_enable: true\n  multi_turn_tool_config_path: {path}\n"


def test_a_missing_tool_config_file_is_named_by_its_key_relative_to_the_config_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # a tools/ folder in the working directory must not be what counts
    message = _problems(tmp_path, AGENT.format(path="tools/calc.yaml"))
    assert f"rollout.multi_turn_tool_config_path: no such file {tmp_path / 'tools' / 'calc.yaml'}" in message
    assert len(message.splitlines()) == 2, "one line per problem, no traceback"


def test_an_unknown_tool_class_is_named_before_anything_starts(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOL)
    (tmp_path / "calc.yaml").write_text(TOOL_CONFIG.format(class_name="my_tools.Divide"))
    message = _problems(tmp_path, AGENT.format(path="calc.yaml"))
    assert "rollout.multi_turn_tool_config_path:" in message and "my_tools.Divide" in message
    assert "has no attribute 'Divide'" in message and len(message.splitlines()) == 2


def test_a_tool_class_beside_the_config_loads_and_the_services_import_it_from_there(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "my_tools.py").write_text(TOOL)
    (folder / "calc.yaml").write_text(TOOL_CONFIG.format(class_name="my_tools.Multiply"))
    (folder / "stack.yaml").write_text(AGENT.format(path="calc.yaml"))
    monkeypatch.chdir(tmp_path)
    config = load_checked(Path("project/stack.yaml"))
    assert config.rollout["multi_turn_tool_config_path"] == str(folder / "calc.yaml")
    assert config.stack.import_dirs[0] == str(folder), "the rollout's PYTHONPATH starts with the config's folder"


def test_a_bad_interaction_config_is_named_by_its_key(tmp_path):
    (tmp_path / "talk.yaml").write_text("interaction:\n  - name: game\n    class_name: nowhere.Game\n")
    message = _problems(
        tmp_path, "rollout:\n  multi_turn_enable: true\n  multi_turn_interaction_config_path: talk.yaml\n"
    )
    assert "rollout.multi_turn_interaction_config_path: cannot import 'nowhere.Game'" in message


def test_a_wrong_reward_function_name_is_named_under_the_key_the_user_wrote(tmp_path):
    (tmp_path / "my_reward.py").write_text(REWARD)
    message = _problems(tmp_path, "custom_reward_function: {path: my_reward.py, name: compute_scor}\n")
    assert (
        "custom_reward_function.name: my_reward.py defines no function 'compute_scor'; did you mean compute_score?"
        in message
    )
    assert "relayrl_user_reward" not in message and "rollout.reward_function" not in message
    message = _problems(tmp_path, "custom_reward_function: {path: nope.py}\n")
    assert f"custom_reward_function.path: no such file {tmp_path / 'nope.py'}" in message


def test_checking_tools_imports_no_torch(tmp_path):
    # The agent part of the check loads the user's classes, not the services: it stays fast.
    (tmp_path / "my_tools.py").write_text(TOOL)
    (tmp_path / "calc.yaml").write_text(TOOL_CONFIG.format(class_name="my_tools.Multiply"))
    path = tmp_path / "stack.yaml"
    path.write_text(AGENT.format(path="calc.yaml"))
    code = (
        "import sys, pathlib; from commands.stack.check import load_checked;"
        f" load_checked(pathlib.Path({str(path)!r})); print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.strip() == "False", done.stderr
