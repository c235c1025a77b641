"""Choosing the reward function: by name, by import path, or by each group's ``data_source``."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from relayrl.tasks import score_builtin
from relayrl.tasks.registry import DATA_SOURCE_PREFIX
from services.rollout.rewards.verifiers import boxed_math, exact_match, gsm8k

# verl's compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict.
RewardFn = Callable[..., Any]

NAMED: dict[str, RewardFn] = {
    "gsm8k": gsm8k,
    "math": boxed_math,
    "exact": exact_match,
    "builtin": score_builtin,
}

_MATH_SOURCES = ("math", "aime", "amc", "numina", "deepscaler", "olympiad")


def by_data_source(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> Any:
    """verl's default dispatch: the verifier that fits the dataset named by ``data_source``."""
    source = data_source.lower()
    if data_source.startswith(DATA_SOURCE_PREFIX):
        fn: RewardFn = score_builtin
    elif "gsm8k" in source:
        fn = gsm8k
    elif any(name in source for name in _MATH_SOURCES):
        fn = boxed_math
    else:
        fn = exact_match
    return fn(data_source, solution_str, ground_truth, extra_info)


def resolve_reward(spec: str) -> RewardFn:
    """``""``/``"auto"``: by data_source; a name in :data:`NAMED`; ``"package.module:function"``; or
    verl's file form ``"/path/to/my_reward.py:function"``."""
    if spec in ("", "auto"):
        return by_data_source
    if spec in NAMED:
        return NAMED[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"reward function {spec!r} is neither one of {sorted(NAMED)} nor 'module:function'")
    try:
        module = _load_file(module_name) if module_name.endswith(".py") else importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise ValueError(f"cannot import reward function {spec!r}: {exc}") from exc
    if not callable(fn):
        raise ValueError(f"reward function {spec!r} is not callable")
    return fn


def _load_file(path: str) -> Any:
    """Imports a reward file by path, as verl's ``custom_reward_function.path`` does."""
    spec = importlib.util.spec_from_file_location(f"relayrl_user_reward_{abs(hash(path))}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except FileNotFoundError as exc:
        raise ImportError(f"no such file {path}") from exc
    return module
