"""Randomly initialised causal LMs of standard Hugging Face architectures, in three sizes.

``init_tiny`` writes a Qwen2 or Llama with the byte-level tokenizer, in exactly the on-disk
layout of a real checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``), so
loading, training, serving and weight updates run the same code as with a real model.

Presets: ``tiny`` (~260 k parameters, tests and toy runs), ``small`` (~13 M, real-shaped runs
on a CPU machine) and ``base`` (the exact shape of Qwen2.5-0.5B, ~494 M, so weight sizes,
memory and compute are those of a real model without a download). ``tiny-rm`` is ``tiny``'s
backbone as a reward model (``*ForSequenceClassification`` with one label), what the reward
service serves in tests and demos. Every preset keeps the
byte-level tokenizer: its 259 ids are a prefix of ``base``'s 151,936-row vocabulary, whose
other rows no text produces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from relayrl.models.tokenizer import IM_END, PAD_TOKEN, byte_vocab, save_byte_tokenizer

Architecture = Literal["qwen2", "llama"]
Dtype = Literal["float32", "bfloat16"]
ARCHITECTURES: tuple[str, ...] = ("qwen2", "llama")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    arch: Architecture = "qwen2"
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    # RoPE has no parameters, so the context can be long at no cost in weights; 2048 fits the
    # realistic workload's prompts (≤128) plus answers (≤512) with room to spare.
    max_positions: int = 2048
    # Exactly the tokenizer's 259 tokens: padded rows that no text can produce would still be
    # sampled by an untrained policy and slow down its first steps of RL.
    vocab_size: int = 259
    # None keeps the architecture's default (what the tiny model has always had).
    rope_theta: float | None = None
    rms_norm_eps: float | None = None
    seed: int = 0
    dtype: Dtype = "float32"
    # 0: a causal LM; n: a sequence-classification head with n labels (a reward model has 1).
    num_labels: int = 0


PRESETS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    "tiny-rm": TinyModelSpec(num_labels=1),
    "small": TinyModelSpec(hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=1536),
    # Qwen2.5-0.5B's config.json, randomly initialised.
    "base": TinyModelSpec(
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        intermediate_size=4864,
        max_positions=32768,
        vocab_size=151936,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
    ),
}


def preset_spec(preset: str, **overrides: Any) -> TinyModelSpec:
    """The spec of a named preset with ``overrides`` (arch, seed, dtype) applied."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if overrides.get("arch", "qwen2") not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {overrides['arch']!r}; choose one of {', '.join(ARCHITECTURES)}")
    if overrides.get("dtype", "float32") not in DTYPES:
        raise ValueError(f"unknown dtype {overrides['dtype']!r}; choose one of {', '.join(DTYPES)}")
    return replace(PRESETS[preset], **overrides)


def hf_config(spec: TinyModelSpec):
    from transformers import LlamaConfig, Qwen2Config

    vocab = byte_vocab()
    if spec.vocab_size < len(vocab):
        raise ValueError(f"vocab_size {spec.vocab_size} is smaller than the tokenizer's {len(vocab)} tokens")
    common: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        eos_token_id=vocab[IM_END],
        pad_token_id=vocab[PAD_TOKEN],
        bos_token_id=None,
        torch_dtype=spec.dtype,
    )
    if spec.rope_theta is not None:
        common["rope_theta"] = spec.rope_theta
    if spec.rms_norm_eps is not None:
        common["rms_norm_eps"] = spec.rms_norm_eps
    if spec.num_labels:
        common["num_labels"] = spec.num_labels
    if spec.arch == "qwen2":
        return Qwen2Config(**common)
    if spec.arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown architecture {spec.arch!r}; choose one of {', '.join(ARCHITECTURES)}")


def count_parameters(config: Any) -> int:
    """Parameters of the model ``config`` describes (tied weights once), without allocating them."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def init_tiny(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Writes a model of ``spec`` and its tokenizer to ``directory`` and returns it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GenerationConfig

    config = hf_config(spec)
    torch.manual_seed(spec.seed)
    # Built directly in the target dtype: a bf16 ``base`` never holds a 2 GB fp32 copy.
    if spec.num_labels:
        model = AutoModelForSequenceClassification.from_config(config, dtype=getattr(torch, spec.dtype))
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, spec.dtype))
        model.generation_config = GenerationConfig(
            eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
        )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_byte_tokenizer(directory)
    return directory
