"""Forward passes over a Hugging Face causal LM with a per-sequence KV cache.

Each sequence keeps its own cache (one ``(keys, values)`` pair per layer, shaped
``[1, kv_heads, length, head_dim]``). A decode step gathers the caches of every running
sequence into one left-padded batch, runs **one** forward pass for all of them and splits the
grown cache back. Padded slots are zeros and masked out, so each row's result is the one a
lone forward pass would give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

# One (keys, values) pair per layer, each [1, kv_heads, length, head_dim].
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass(slots=True)
class ForwardCounts:
    prefill: int = 0
    decode: int = 0
    # Largest number of sequences that shared one decode forward pass.
    max_decode_batch: int = 0

    @property
    def total(self) -> int:
        return self.prefill + self.decode


def _split_cache(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


class ModelRunner:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.counts = ForwardCounts()

    @torch.inference_mode()
    def prefill(self, prompts: Sequence[Sequence[int]]) -> list[tuple[KVCache, torch.Tensor]]:
        """Runs every prompt in **one** left-padded pass; returns each one's cache and next-token logits.

        Padding is masked out and cut from the returned caches, so each row is what a lone
        forward pass over that prompt would give.
        """
        lengths = [len(p) for p in prompts]
        longest = max(lengths)
        input_ids = torch.zeros((len(prompts), longest), dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, longest - lengths[row] :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, longest - lengths[row] :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        self.counts.prefill += 1
        layers = _split_cache(out.past_key_values)
        results = []
        for row, length in enumerate(lengths):
            start = longest - length
            cache = [(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in layers]
            results.append((cache, out.logits[row, -1].float()))
        return results

    @torch.inference_mode()
    def decode(self, caches: Sequence[KVCache], last_tokens: Sequence[int]) -> tuple[list[KVCache], torch.Tensor]:
        """Feeds one new token per sequence in one batched pass; returns grown caches and next logits [B, V]."""
        batch = len(caches)
        lengths = [cache[0][0].shape[2] for cache in caches]
        longest = max(lengths)
        padded: list[tuple[torch.Tensor, torch.Tensor]] = []
        for layer in range(len(caches[0])):
            keys0, values0 = caches[0][layer]
            keys = keys0.new_zeros((batch, keys0.shape[1], longest, keys0.shape[3]))
            values = values0.new_zeros((batch, values0.shape[1], longest, values0.shape[3]))
            for row, cache in enumerate(caches):
                start = longest - lengths[row]
                keys[row, :, start:] = cache[layer][0][0]
                values[row, :, start:] = cache[layer][1][0]
            padded.append((keys, values))
        attention_mask = torch.zeros((batch, longest + 1), dtype=torch.long)
        for row, length in enumerate(lengths):
            attention_mask[row, longest - length :] = 1
        out = self.model(
            input_ids=torch.tensor([[t] for t in last_tokens], dtype=torch.long),
            attention_mask=attention_mask,
            position_ids=torch.tensor([[length] for length in lengths], dtype=torch.long),
            past_key_values=DynamicCache(padded),
            use_cache=True,
        )
        self.counts.decode += 1
        self.counts.max_decode_batch = max(self.counts.max_decode_batch, batch)
        grown = _split_cache(out.past_key_values)
        new_caches = []
        for row in range(batch):
            start = longest - lengths[row]
            new_caches.append([(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in grown])
        return new_caches, out.logits[:, -1].float()
