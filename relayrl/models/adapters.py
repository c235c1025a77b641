"""LoRA adapters on disk in peft's format, the one peft, SGLang's ``/load_lora_adapter`` and the
built-in engine read: a directory of ``adapter_config.json`` (``r``, ``lora_alpha``,
``target_modules``) and ``adapter_model.safetensors`` with peft's tensor names
(``base_model.model.<module>.lora_A.weight`` [r, in] and ``...lora_B.weight`` [out, r]).

Torch-free: the rollout, which hands each adapter version to its engine as such a directory,
never loads torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# peft's prefix of every tensor of a causal LM's adapter (PeftModelForCausalLM → LoraModel → model).
PEFT_PREFIX = "base_model.model."


def adapter_dir(weights_file: Path, out_dir: Path, lora_alpha: float) -> Path | None:
    """``out_dir`` made a peft adapter directory for ``weights_file`` when that file holds LoRA
    tensors only (an adapter version; else None): ``adapter_config.json`` with the rank and target
    modules its tensors show and ``lora_alpha``, and ``adapter_model.safetensors`` linked to the file."""
    from safetensors import safe_open

    with safe_open(str(weights_file), "np") as f:
        names = list(f.keys())
        if not names or not all(".lora_A." in n or ".lora_B." in n for n in names):
            return None
        first_a = next(n for n in names if ".lora_A." in n)
        rank = int(f.get_slice(first_a).get_shape()[0])
    targets = sorted({n.split(".lora_")[0].rsplit(".", 1)[-1] for n in names})
    out_dir.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": lora_alpha, "target_modules": targets, "bias": "none"}
    (out_dir / CONFIG_FILE).write_text(json.dumps(config))
    link = out_dir / WEIGHTS_FILE
    link.unlink(missing_ok=True)
    # Not resolved: the file may be a link to another process's memory file (/proc/<pid>/fd/<fd>),
    # which resolves to a name no one can open.
    link.symlink_to(os.path.abspath(weights_file))
    return out_dir
