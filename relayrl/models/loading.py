"""Loading any Hugging Face causal LM directory (a tiny built-in one or a real checkpoint).

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
