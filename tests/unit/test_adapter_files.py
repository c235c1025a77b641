"""A published adapter version becomes a peft adapter directory the engine (and SGLang) loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from relayrl.models.adapters import CONFIG_FILE, WEIGHTS_FILE, adapter_dir

PREFIX = "base_model.model.model.layers.0"


def test_an_adapter_version_gets_peft_config_with_rank_and_targets_and_links_its_file(tmp_path: Path) -> None:
    weights = tmp_path / "v3.safetensors"
    tensors = {
        f"{PREFIX}.self_attn.q_proj.lora_A.weight": np.zeros((4, 16), np.float32),
        f"{PREFIX}.self_attn.q_proj.lora_B.weight": np.zeros((16, 4), np.float32),
        f"{PREFIX}.mlp.down_proj.lora_A.weight": np.zeros((4, 32), np.float32),
        f"{PREFIX}.mlp.down_proj.lora_B.weight": np.zeros((16, 4), np.float32),
    }
    save_file(tensors, str(weights))

    out = adapter_dir(weights, tmp_path / "adapters" / "v3", lora_alpha=8.0)

    assert out == tmp_path / "adapters" / "v3"
    config = json.loads((out / CONFIG_FILE).read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["down_proj", "q_proj"])
    assert (out / WEIGHTS_FILE).is_symlink() and (out / WEIGHTS_FILE).read_bytes() == weights.read_bytes()


def test_full_weights_are_not_an_adapter(tmp_path: Path) -> None:
    weights = tmp_path / "v1.safetensors"
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), np.float32)}, str(weights))
    assert adapter_dir(weights, tmp_path / "out", lora_alpha=16.0) is None
    assert not (tmp_path / "out").exists()
