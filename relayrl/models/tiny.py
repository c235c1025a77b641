"""Tiny causal LMs of standard Hugging Face architectures, for CPU runs and tests.

``init_tiny`` writes a randomly initialised Qwen2 or Llama (a few hundred thousand
parameters) with the byte-level tokenizer, in exactly the on-disk layout of a real
checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``), so loading,
training, serving and weight updates run the same code as with a real model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from relayrl.models.tokenizer import IM_END, PAD_TOKEN, byte_vocab, save_byte_tokenizer

Architecture = Literal["qwen2", "llama"]


@dataclass(frozen=True, slots=True)
class TinyModelSpec:
    arch: Architecture = "qwen2"
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_positions: int = 512
    # Exactly the tokenizer's 259 tokens: padded rows that no text can produce would still be
    # sampled by an untrained policy and slow down its first steps of RL.
    vocab_size: int = 259
    seed: int = 0


def _hf_config(spec: TinyModelSpec):
    from transformers import LlamaConfig, Qwen2Config

    vocab = byte_vocab()
    if spec.vocab_size < len(vocab):
        raise ValueError(f"vocab_size {spec.vocab_size} is smaller than the tokenizer's {len(vocab)} tokens")
    common = dict(
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
        torch_dtype="float32",
    )
    if spec.arch == "qwen2":
        return Qwen2Config(**common)
    if spec.arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown architecture {spec.arch!r}; choose qwen2 or llama")


def init_tiny(directory: Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Writes a tiny model and its tokenizer to ``directory`` and returns it."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = _hf_config(spec)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, do_sample=True
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    save_byte_tokenizer(directory)
    return directory
