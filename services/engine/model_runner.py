"""Forward passes over a Hugging Face causal LM with a batched, preallocated KV cache.

Running sequences live in a :class:`KVSlots`: per layer one keys and one values buffer shaped
``[rows, kv_heads, capacity, head_dim]``, one row per running sequence, each sequence's tokens
left-aligned in its row (``[0, length)``). A decode step writes every sequence's new key/value
in place at its own length and attends over ``[:rows, :, :longest + 1]`` with a mask that hides
each shorter row's unused tail, so no step copies the cache. Memory is claimed in chunks:
``capacity`` grows by :data:`CAPACITY_CHUNK` tokens and the row count doubles, each growth
copying the buffers once (amortised over the steps until the next one). Rows stay dense: a
sequence that leaves hands its row to the last one (one row copied), so the set of rows only
moves when the set of running sequences changes.

Hidden positions are masked out and every row keeps its own position ids, so each row's logits
are the ones a lone forward pass over that sequence gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.engine.lora import LoraAdapter, LoraSet

# One (keys, values) pair per layer, each [1, kv_heads, length, head_dim]: a prefilled prompt.
KVCache = list[tuple[torch.Tensor, torch.Tensor]]

# Tokens of capacity claimed at a time; a growth copies the buffers, so it is rare (every
# CAPACITY_CHUNK decode steps at most) and its cost is spread over the steps in between.
CAPACITY_CHUNK = 256


@dataclass(slots=True)
class ForwardCounts:
    prefill: int = 0
    decode: int = 0
    # Largest number of sequences that shared one decode forward pass.
    max_decode_batch: int = 0

    @property
    def total(self) -> int:
        return self.prefill + self.decode


@dataclass(eq=False, slots=True)
class Slot:
    """A running sequence's place in :class:`KVSlots`: its row and how many tokens it holds."""

    row: int
    length: int
    released: bool = False


class KVSlots:
    """The KV cache of every running sequence, one row each (see the module docstring)."""

    def __init__(self, chunk: int = CAPACITY_CHUNK) -> None:
        self.chunk = chunk
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots: list[Slot] = []
        # How many times the buffers were reallocated; a test checks growth stays chunked.
        self.reallocations = 0

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def clear(self) -> None:
        """Drops every row at once (after a failed step, whose buffers may be half-written)."""
        for slot in self.slots:
            slot.released = True
        self.slots, self.keys, self.values = [], [], []

    # Every buffer op runs in inference mode: buffers created there may only be written there.
    @torch.inference_mode()
    def insert(self, cache: KVCache) -> Slot:
        """Takes a prefilled cache into a new row (copying that one sequence once)."""
        length = cache[0][0].shape[2]
        if not self.keys:
            self.keys = [k.new_zeros((0, k.shape[1], 0, k.shape[3])) for k, _ in cache]
            self.values = [v.new_zeros((0, v.shape[1], 0, v.shape[3])) for _, v in cache]
        self._reserve(len(self.slots) + 1, length)
        slot = Slot(row=len(self.slots), length=length)
        for layer, (k, v) in enumerate(cache):
            self.keys[layer][slot.row, :, :length] = k[0]
            self.values[layer][slot.row, :, :length] = v[0]
        self.slots.append(slot)
        return slot

    @torch.inference_mode()
    def release(self, slot: Slot) -> None:
        """Frees ``slot``'s row; the last row moves into it so rows stay dense."""
        if slot.released:
            return
        slot.released = True
        last = self.slots.pop()
        if last is not slot:
            for buffers in (self.keys, self.values):
                for buffer in buffers:
                    buffer[slot.row, :, : last.length] = buffer[last.row, :, : last.length]
            last.row = slot.row
            self.slots[slot.row] = last
        if not self.slots:
            # An idle engine holds no cache memory.
            self.keys, self.values = [], []

    @torch.inference_mode()
    def _reserve(self, rows: int, length: int) -> None:
        have_rows, have_len = self.keys[0].shape[0], self.keys[0].shape[2]
        if rows <= have_rows and length <= have_len:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_len = -(-length // self.chunk) * self.chunk if length > have_len else have_len
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                grown = old.new_zeros((new_rows, old.shape[1], new_len, old.shape[3]))
                grown[: old.shape[0], :, : old.shape[2]] = old
                buffers[layer] = grown
        self.reallocations += 1


class _SlotsCache:
    """What the model's attention layers see during a decode step: writes in place, reads views.

    Only ``update`` is called (position ids and a ready 4-D mask are passed explicitly).
    """

    def __init__(self, slots: KVSlots, rows: torch.Tensor, positions: torch.Tensor, width: int) -> None:
        self.slots, self.rows, self.positions, self.width = slots, rows, positions, width

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.slots.keys[layer_idx], self.slots.values[layer_idx]
        keys[self.rows, :, self.positions] = key_states[:, :, 0]
        values[self.rows, :, self.positions] = value_states[:, :, 0]
        n = self.rows.shape[0]
        return keys[:n, :, : self.width], values[:n, :, : self.width]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, chunk: int = CAPACITY_CHUNK, lora: LoraSet | None = None) -> None:
        self.model = model
        self.lora = lora if lora is not None else LoraSet(model)
        self.counts = ForwardCounts()
        self.kv = KVSlots(chunk)

    @torch.inference_mode()
    def prefill(
        self, prompts: Sequence[Sequence[int]], adapters: Sequence[LoraAdapter | None] | None = None
    ) -> list[tuple[KVCache, torch.Tensor]]:
        """Runs every prompt in **one** left-padded pass; returns each one's cache and next-token logits.

        Padding is masked out and cut from the returned caches, so each row is what a lone
        forward pass over that prompt would give. ``adapters`` names each prompt's LoRA adapter
        (None: the base model).
        """
        lengths = [len(p) for p in prompts]
        longest = max(lengths)
        input_ids = torch.zeros((len(prompts), longest), dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, longest - lengths[row] :] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, longest - lengths[row] :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        with self.lora.rows(adapters or []):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
        self.counts.prefill += 1
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        results = []
        for row, length in enumerate(lengths):
            start = longest - length
            cache = [(k[row : row + 1, :, start:], v[row : row + 1, :, start:]) for k, v in layers]
            results.append((cache, out.logits[row, -1].float()))
        return results

    @torch.inference_mode()
    def decode(
        self,
        slots: Sequence[Slot],
        last_tokens: Sequence[int],
        adapters: Sequence[LoraAdapter | None] | None = None,
    ) -> torch.Tensor:
        """Feeds one token per sequence in one batched pass over every row of ``self.kv``.

        ``slots`` must be exactly the running rows (in any order); each grows by one token, with
        the LoRA adapter ``adapters`` names for it (None: the base model).
        Returns next-token logits ``[len(slots), V]`` in the order of ``slots``.
        """
        kv = self.kv
        if len(slots) != len(kv) or any(s.released for s in slots):
            raise ValueError(f"decode needs every running row: got {len(slots)} slots for {len(kv)} rows")
        batch = len(slots)
        lengths = [0] * batch
        tokens = [0] * batch
        row_adapters: list[LoraAdapter | None] = [None] * batch
        for i, (slot, token) in enumerate(zip(slots, last_tokens, strict=True)):
            lengths[slot.row], tokens[slot.row] = slot.length, token
            if adapters is not None:
                row_adapters[slot.row] = adapters[i]
        width = max(lengths) + 1
        kv._reserve(batch, width)
        positions = torch.tensor(lengths, dtype=torch.long)
        # Row r sees its own tokens [0, length_r] and nothing of the unused tail after them.
        mask = (torch.arange(width) <= positions[:, None])[:, None, None, :]
        with self.lora.rows(row_adapters):
            out = self.model(
                input_ids=torch.tensor(tokens, dtype=torch.long)[:, None],
                attention_mask=mask,
                position_ids=positions[:, None],
                past_key_values=_SlotsCache(kv, torch.arange(batch), positions, width),
                use_cache=True,
            )
        self.counts.decode += 1
        self.counts.max_decode_batch = max(self.counts.max_decode_batch, batch)
        for slot in slots:
            slot.length += 1
        logits = out.logits[:, -1].float()
        return logits[torch.tensor([s.row for s in slots])]
