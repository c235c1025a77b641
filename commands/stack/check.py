"""``relayrl check``: the whole stack config checked before any process starts.

Each section is validated by its service's own settings model (``extra="forbid"``), so an
unknown key or a value out of range is reported by YAML key and file, with the closest valid
name; dataset files must exist and parse, the reward function must import with verl's
signature, tool and interaction configs must load (their files read, their classes imported and
built, as the rollout does at start), and fixed ports must be free.

One path rule: every input path in the file (``stack.model_dir``, datasets, the reward file,
the reward model, tool and interaction configs, ``rollout.tokenizer_path``) is relative to the
config file's folder, except ``builtin:<task>``, a dataset or interaction config the package ships
(``relayrl.tasks``); modules the config names (tool and interaction classes,
``module:function`` rewards) import from that folder first, then from the working directory; the
rollouts get the same folders on their ``PYTHONPATH`` (``stack.import_dirs``). Each problem is one
line naming the YAML key as written. A setting under a former name (``trainer.checkpoint_every``)
still works, with one warning line naming the setting that replaced it. Only light imports here (no
torch): the check answers in well under two seconds.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import inspect
import logging
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from commands.stack.config import SERVICE_SECTIONS, StackConfig, StackSettings

log = logging.getLogger(__name__)

# Each section's settings model; imported lazily so a section's import cost is paid once.
SETTINGS_MODELS: dict[str, str] = {
    "queue": "services.queue.config:QueueSettings",
    "paramsync": "services.paramsync.config:ParamSyncSettings",
    "engine": "services.engine.config:EngineSettings",
    "rollout": "services.rollout.config:RolloutSettings",
    "trainer": "services.trainer.config:TrainerSettings",
    "reward": "services.reward.config:RewardSettings",
}

REWARD_SIGNATURE = "compute_score(data_source, solution_str, ground_truth, extra_info=None)"

# Keys the stack sets itself for every service (its wiring); a value in the file is overridden.
WIRED_KEYS = ("host", "grpc_port", "http_port")

# Input paths of the rollout section, resolved against the config file's folder like every other.
ROLLOUT_PATHS = ("multi_turn_tool_config_path", "multi_turn_interaction_config_path", "tokenizer_path")


class ConfigError(ValueError):
    """The config cannot run; ``problems`` are one line each, ready to print."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid config\n" + "\n".join(f"  {p}" for p in problems))


def settings_model(section: str) -> type[BaseModel]:
    module_name, _, name = SETTINGS_MODELS[section].partition(":")
    return getattr(importlib.import_module(module_name), name)


def load_checked(path: Path) -> StackConfig:
    """Reads, resolves and checks ``path``; raises :class:`ConfigError` listing every problem."""
    source = str(path)
    if not path.is_file():
        raise ConfigError(source, ["no such file"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(source, [_yaml_problem(exc)]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, [f"expected a mapping with sections stack, {', '.join(SERVICE_SECTIONS)}"])
    try:
        config = StackConfig.model_validate(data)
    except ValidationError as exc:
        problems = _top_level_problems(exc)
        for section in SERVICE_SECTIONS:
            if isinstance(data.get(section), dict):
                problems += _section_problems(section, data[section])
        raise ConfigError(source, problems) from None
    return check_config(config, path.resolve().parent, source)


def check_config(config: StackConfig, base: Path, source: str = "config") -> StackConfig:
    """Resolves paths against ``base`` and checks every section; returns the resolved config."""
    problems: list[str] = []
    reward_key = _resolve_reward_file(config, base, problems)
    for name in ("dataset", "val_dataset"):
        value = config.trainer.get(name)
        if isinstance(value, str) and value and not value.startswith("builtin:"):
            config.trainer[name] = str(_resolve(value, base))
    for name in ROLLOUT_PATHS:
        value = config.rollout.get(name)
        if isinstance(value, str) and value and not value.startswith("builtin:"):
            config.rollout[name] = str(_resolve(value, base))
    if config.stack.model_dir is not None:
        config.stack.model_dir = _resolve(str(config.stack.model_dir), base)
    config.stack.import_dirs = list(
        dict.fromkeys([str(base), *(str(_resolve(d, base)) for d in config.stack.import_dirs)])
    )
    problems += _agent_only(config)
    if config.uses_reward_model():
        config.reward["model_path"] = str(_resolve(str(config.reward["model_path"]), base))
    for section in SERVICE_SECTIONS:
        values = getattr(config, section)
        if section == "rollout" and config.uses_reward_model():
            # The stack wires the reward service's URL into the rollouts when it starts it.
            values = {"reward_kind": "model", **values, "reward_model_url": "http://reward"}
        problems += _section_problems(section, values)
    if config.uses_reward_model() and not (Path(config.reward["model_path"]) / "config.json").is_file():
        problems.append(f"reward.model_path: {config.reward['model_path']} is not a Hugging Face model directory")
    if not problems:
        problems += _dataset_problems(config)
        with importable_from(config.stack.import_dirs):
            problems += _reward_problems(config, reward_key)
            problems += _agent_problems(config)
        problems += _port_problems(config)
        problems += _lora_problems(config)
    if config.stack.model_dir is not None and not (config.stack.model_dir / "config.json").is_file():
        problems.append(f"stack.model_dir: {config.stack.model_dir} is not a Hugging Face model directory")
    if problems:
        raise ConfigError(source, problems)
    for line in _former_name_lines(config):
        log.warning(line)
    return config


def _former_name_lines(config: StackConfig) -> list[str]:
    """A line for each setting written under a former name, naming the one that replaced it."""
    lines = []
    for section in SERVICE_SECTIONS:
        former = getattr(settings_model(section), "former_names", {})
        for old in getattr(config, section):
            if old in former:
                new = former[old]
                lines.append(
                    f"{section}.{old}: deprecated, the former name of {section}.{new}, which it sets; rename it"
                )
    return lines


def _resolve(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"YAML syntax error at {where}{problem}"


def _top_level_problems(exc: ValidationError) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = [str(part) for part in err["loc"]]
        if err["type"] == "extra_forbidden" and len(loc) == 1:
            valid = list(StackConfig.model_fields)
            problems.append(f"{loc[0]}: unknown section{_did_you_mean(loc[0], valid)}; sections: {', '.join(valid)}")
        elif err["type"] == "extra_forbidden" and loc[0] == "stack":
            problems.append(
                f"{'.'.join(loc)}: unknown setting{_did_you_mean(loc[-1], list(StackSettings.model_fields), 'stack.')}"
            )
        else:
            problems.append(f"{'.'.join(loc)}: {err['msg']}{_given(err)}")
    return problems


def _section_problems(section: str, values: dict[str, Any]) -> list[str]:
    model = settings_model(section)
    fields = list(model.model_fields)
    try:
        model.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else ""
            if err["type"] == "extra_forbidden":
                problems.append(f"{section}.{key}: unknown setting{_did_you_mean(key, fields, section + '.')}")
            elif key:
                problems.append(f"{section}.{key}: {err['msg']}{_given(err)}")
            else:
                problems.append(f"{section}: {err['msg'].removeprefix('Value error, ')}")
        return problems
    return []


def _did_you_mean(key: str, valid: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{close[0]}?" if close else ""


def _given(err: Any) -> str:
    given = err.get("input")
    return "" if isinstance(given, dict) else f" (got {given!r})"


def _resolve_reward_file(config: StackConfig, base: Path, problems: list[str]) -> str:
    """Resolves the reward file against ``base``; returns the YAML key the user wrote it under."""
    custom = config.custom_reward_function
    if custom is not None:
        if config.rollout.get("reward_function", "auto") not in ("", "auto"):
            problems.append("custom_reward_function and rollout.reward_function are both set; keep one")
            return "custom_reward_function"
        config.rollout["reward_function"] = f"{_resolve(custom.path, base)}:{custom.name}"
        config.custom_reward_function = None
        return "custom_reward_function"
    spec = config.rollout.get("reward_function")
    if isinstance(spec, str):
        file, sep, name = spec.rpartition(":")
        if sep and file.endswith(".py"):
            config.rollout["reward_function"] = f"{_resolve(file, base)}:{name}"
    return "rollout.reward_function"


@contextlib.contextmanager
def importable_from(dirs: list[str]) -> Iterator[None]:
    """Modules import from ``dirs`` first, then from the working directory, as in the services
    the stack starts (their ``PYTHONPATH``) and from where it starts them."""
    added = [*dirs, os.getcwd()]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            sys.path.remove(entry)


def _lora_problems(config: StackConfig) -> list[str]:
    """A LoRA version carries the adapter's tensors, not its alpha: each rollout loads it with its
    own lora_alpha, and an engine given another alpha than the trainer's scales every update wrongly."""
    if not int(config.trainer.get("lora_rank", 0)):
        return []
    alphas = {
        section: float(
            getattr(config, section).get("lora_alpha", settings_model(section).model_fields["lora_alpha"].default)
        )
        for section in ("trainer", "rollout")
    }
    if alphas["trainer"] == alphas["rollout"]:
        return []
    return [
        f"rollout.lora_alpha ({alphas['rollout']:g}) must equal trainer.lora_alpha ({alphas['trainer']:g}):"
        " a version carries the adapter's tensors, not its alpha"
    ]


def _dataset_problems(config: StackConfig) -> list[str]:
    from services.trainer.data import read_rows

    problems = []
    for name in ("dataset", "val_dataset"):
        value = config.trainer.get(name, "builtin:copy" if name == "dataset" else "")
        if not value:
            continue
        try:
            rows = read_rows(str(value), size=1, difficulty=1, seed=0, split="train")
        except Exception as exc:  # any parse failure is the user's file to fix
            problems.append(f"trainer.{name}: {_short(exc)}")
            continue
        if not rows:
            problems.append(f"trainer.{name}: {value} has no rows")
        elif "prompt" not in rows[0]:
            problems.append(
                f"trainer.{name}: rows of {value} have no 'prompt' field (verl format); got {list(rows[0])}"
            )
    return problems


def _reward_problems(config: StackConfig, key: str) -> list[str]:
    from services.rollout.rewards.registry import resolve_reward

    spec = str(config.rollout.get("reward_function", "auto"))
    file, sep, name = spec.rpartition(":")
    if sep and file.endswith(".py") and (problem := _reward_file_problem(Path(file), name, key)):
        return [problem]
    try:
        fn = resolve_reward(spec)
    except Exception as exc:  # a user module may raise anything at import
        hint = ""
        if isinstance(exc.__cause__, ModuleNotFoundError) and not file.endswith(".py"):
            hint = (
                f"; not importable from {', '.join(config.stack.import_dirs)} or {os.getcwd()}: use verl's form"
                " custom_reward_function: {path: my_reward.py, name: compute_score} (relative to this file)"
            )
        return [f"{key}: {_short(exc)}{hint}"]
    try:
        inspect.signature(fn).bind("data_source", "solution", "truth", extra_info=None)
    except TypeError:
        return [f"{key}: {spec} must accept {REWARD_SIGNATURE}"]
    except ValueError:
        pass  # a builtin without an inspectable signature
    return []


def _reward_file_problem(file: Path, name: str, key: str) -> str:
    """A reward file that is missing or lacks the function, under the keys the user wrote."""
    path_key, name_key = (f"{key}.path", f"{key}.name") if key == "custom_reward_function" else (key, key)
    if not file.is_file():
        return f"{path_key}: no such file {file}"
    try:
        tree = ast.parse(file.read_text(), str(file))
    except SyntaxError as exc:
        return f"{path_key}: {file} line {exc.lineno}: {exc.msg}"
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    if name in defined or name in assigned or name in imported:
        return ""
    close = _did_you_mean(name, defined)
    return f"{name_key}: {file.name} defines no function {name!r}{close}; it defines: {', '.join(defined) or 'none'}"


def _agent_only(config: StackConfig) -> list[str]:
    """``rollout.source: agents`` is one switch: the trainer then releases no prompts either, and
    runs no validation (its held-out prompts would wait for a rollout that leases nothing)."""
    if config.rollout.get("source") != "agents":
        if config.trainer.get("prompt_source") == "agents":
            return ["trainer.prompt_source: set rollout.source: agents instead (it sets both)"]
        return []
    if config.trainer.setdefault("prompt_source", "agents") != "agents":
        return [f"trainer.prompt_source: {config.trainer['prompt_source']!r} contradicts rollout.source: agents"]
    return [
        f"trainer.{key}: validation releases held-out prompts, which no rollout generates with rollout.source:"
        " agents; leave it out"
        for key in ("test_freq", "val_before_train")
        if config.trainer.get(key)
    ]


def _agent_problems(config: StackConfig) -> list[str]:
    """The tool and interaction configs loaded as the rollout loads them at start: files read,
    classes imported and built, verl's methods present."""
    from services.rollout.agent.interactions import load_interactions
    from services.rollout.agent.tools import load_tools

    problems = []
    for name, load in (
        ("multi_turn_tool_config_path", load_tools),
        ("multi_turn_interaction_config_path", load_interactions),
    ):
        value = config.rollout.get(name)
        if not value:
            continue
        if not value.startswith("builtin:") and not Path(value).is_file():
            problems.append(f"rollout.{name}: no such file {value}")
            continue
        try:
            load(value)
        except Exception as exc:  # a user class may raise anything when built
            problems.append(f"rollout.{name}: {_short(exc)}")
    if config.rollout.get("multi_turn_tool_config_path") and not config.rollout.get("multi_turn_enable"):
        problems.append(
            "rollout.multi_turn_tool_config_path: set, but rollout.multi_turn_enable is false (tools unused)"
        )
    return problems


def _port_problems(config: StackConfig) -> list[str]:
    problems = []
    for section in SERVICE_SECTIONS:
        for key, value in getattr(config, section).items():
            fixed = key.endswith("_port") and key not in WIRED_KEYS and isinstance(value, int) and value > 0
            if fixed and not _port_free(value):
                problems.append(f"{section}.{key}: port {value} is in use; choose another or 0 for any free port")
    return problems


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())
