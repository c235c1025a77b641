"""A small randomly initialised causal LM for engine tests: two layers, grouped-query attention."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config


def random_causal_lm(kind: str = "qwen2") -> torch.nn.Module:
    """A ``qwen2`` or ``llama`` model of vocabulary 97 and hidden size 32, seeded, in eval mode."""
    config_class = Qwen2Config if kind == "qwen2" else LlamaConfig
    config = config_class(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()
