"""Loading any Hugging Face causal LM directory (a tiny built-in one or a real checkpoint), and
writing a trained policy as one.

Everything is read from local disk; nothing is fetched from a hub.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def check_model_dir(directory: Path) -> None:
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"{directory} is not a model directory (no config.json); create one with"
            f" `relayrl model init-tiny {directory}`"
        )


def load_tokenizer(directory: str | Path) -> Any:
    from transformers import AutoTokenizer

    directory = Path(directory)
    check_model_dir(directory)
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def load_causal_lm(directory: str | Path, dtype: str = "float32", device: str = "cpu") -> Any:
    """Loads the model in ``directory`` with transformers, in eval mode on ``device``."""
    import torch
    from transformers import AutoModelForCausalLM

    directory = Path(directory)
    check_model_dir(directory)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=getattr(torch, dtype), local_files_only=True)
    return model.to(device).eval()


def save_hf_dir(model: Any, base_dir: str | Path, out_dir: Path) -> None:
    """Writes ``model`` (a causal LM holding the trained weights) with the tokenizer and generation
    config of ``base_dir``, the model it was trained from: what ``from_pretrained`` loads.

    ``relayrl export`` and the trainer's ``save_hf_model`` both write through here, so the two
    directories of one checkpoint are the same.
    """
    from transformers import GenerationConfig

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    load_tokenizer(base_dir).save_pretrained(out_dir)
    try:
        generation = GenerationConfig.from_pretrained(str(base_dir), local_files_only=True)
    except OSError:
        generation = GenerationConfig.from_model_config(model.config)
    generation.save_pretrained(out_dir)
