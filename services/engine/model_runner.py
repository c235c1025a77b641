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

Prompts are prefilled the same way, straight into new rows: a pass feeds each new row its
prompt tokens after whatever the row already holds, which is nothing or a prefix of the prompt
copied from the :class:`~services.engine.prefix_cache.PrefixCache` (an earlier turn of the same
conversation), so a continued conversation is prefilled from its new tokens only.

Hidden positions are masked out and every row keeps its own position ids, so each row's logits
are the ones a lone forward pass over that sequence gives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from services.engine.lora import LoraAdapter, LoraSet
from services.engine.prefix_cache import CachedPrefix, PrefixCache

# Tokens of capacity claimed at a time; a growth copies the buffers, so it is rare (every
# CAPACITY_CHUNK decode steps at most) and its cost is spread over the steps in between.
CAPACITY_CHUNK = 256


@dataclass(slots=True)
class ForwardCounts:
    prefill: int = 0
    decode: int = 0
    # Largest number of sequences that shared one decode forward pass.
    max_decode_batch: int = 0
    # Prompt tokens fed to prefill passes, and prompt tokens whose keys and values the prefix cache gave.
    prefill_tokens: int = 0
    cached_tokens: int = 0

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

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, chunk: int = CAPACITY_CHUNK
    ) -> None:
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
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
    def add(self, prefix: CachedPrefix | None = None, length: int = 0) -> Slot:
        """A new last row holding the first ``length`` tokens of ``prefix`` (copied), or nothing."""
        if not self.keys:
            empty = (0, self.kv_heads, 0, self.head_dim)
            self.keys = [torch.zeros(empty, dtype=self.dtype) for _ in range(self.layers)]
            self.values = [torch.zeros(empty, dtype=self.dtype) for _ in range(self.layers)]
        self._reserve(len(self.slots) + 1, length)
        slot = Slot(row=len(self.slots), length=length)
        if prefix is not None and length:
            for layer in range(self.layers):
                self.keys[layer][slot.row, :, :length] = prefix.keys[layer][:, :length]
                self.values[layer][slot.row, :, :length] = prefix.values[layer][:, :length]
        self.slots.append(slot)
        return slot

    @torch.inference_mode()
    def fork(self, slot: Slot) -> Slot:
        """A new last row holding a copy of ``slot``'s tokens (another sample of the same prompt)."""
        self._reserve(len(self.slots) + 1, slot.length)
        twin = Slot(row=len(self.slots), length=slot.length)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[twin.row, :, : slot.length] = buffer[slot.row, :, : slot.length]
        self.slots.append(twin)
        return twin

    def row(self, slot: Slot) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Views of ``slot``'s keys and values, per layer ``[kv_heads, length, head_dim]``."""
        return (
            [buffer[slot.row, :, : slot.length] for buffer in self.keys],
            [buffer[slot.row, :, : slot.length] for buffer in self.values],
        )

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
    """What the model's attention layers see during a pass over a block of rows: writes in place, reads views.

    Only ``update`` is called (position ids and a ready 4-D mask are passed explicitly). Rows
    ``[first, first + n)`` take part; token ``j`` of batch row ``b`` is written at
    ``positions[b, j]``.
    """

    def __init__(self, slots: KVSlots, first: int, positions: torch.Tensor, width: int) -> None:
        self.slots, self.first, self.positions, self.width = slots, first, positions, width
        self.rows = torch.arange(first, first + positions.shape[0])[:, None]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.slots.keys[layer_idx], self.slots.values[layer_idx]
        # [rows, kv_heads, tokens, head_dim] -> the [rows, tokens, kv_heads, head_dim] the indexing selects.
        keys[self.rows, :, self.positions] = key_states.transpose(1, 2)
        values[self.rows, :, self.positions] = value_states.transpose(1, 2)
        block = slice(self.first, self.first + self.positions.shape[0])
        return keys[block, :, : self.width], values[block, :, : self.width]


@dataclass(frozen=True, slots=True)
class Prefilled:
    """A prompt taken into the running rows: its row, its next-token logits, and how many of its
    tokens came from the prefix cache instead of the forward pass."""

    slot: Slot
    logits: torch.Tensor
    cached_tokens: int


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        chunk: int = CAPACITY_CHUNK,
        lora: LoraSet | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self.model = model
        self.lora = lora if lora is not None else LoraSet(model)
        self.counts = ForwardCounts()
        config = model.config
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        dtype = next(model.parameters()).dtype
        self.kv = KVSlots(int(config.num_hidden_layers), kv_heads, int(head_dim), dtype, chunk)
        self.prefixes = PrefixCache(prefix_cache_bytes)

    @torch.inference_mode()
    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        adapters: Sequence[LoraAdapter | None] | None = None,
        matches: Sequence[tuple[CachedPrefix, int] | None] | None = None,
    ) -> list[Prefilled]:
        """Takes every prompt into a new running row and returns each one's row and next-token logits.

        A prompt that continues a cached sequence (:class:`PrefixCache`) starts from a copy of its
        keys and values and feeds only the rest. Prompts are fed in batched passes over their new
        rows, each pass grouping prompts of similar remaining length (:data:`PAD_LIMIT`), so a
        short continuation does not pay for a long prompt's padding. ``adapters`` names each
        prompt's LoRA adapter (None: the base model); ``matches``, each prompt's
        :meth:`PrefixCache.lookup` where the caller looked it up already.
        """
        chosen = list(adapters) if adapters is not None else [None] * len(prompts)
        hits = (
            list(matches)
            if matches is not None
            else [self.prefixes.lookup(prompt, adapter) for prompt, adapter in zip(prompts, chosen, strict=True)]
        )
        cached = [hit[1] if hit else 0 for hit in hits]
        longest_first = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) - cached[i], reverse=True)
        results: list[Prefilled | None] = [None] * len(prompts)
        for group in _similar_lengths(longest_first, [len(p) - c for p, c in zip(prompts, cached, strict=True)]):
            slots = [self.kv.add(hits[i][0] if hits[i] else None, cached[i]) for i in group]
            logits = self._forward(slots, [prompts[i][cached[i] :] for i in group], [chosen[i] for i in group])
            self.counts.prefill += 1
            for row, i in enumerate(group):
                results[i] = Prefilled(slots[row], logits[row], cached[i])
                self.counts.prefill_tokens += len(prompts[i]) - cached[i]
                self.counts.cached_tokens += cached[i]
        return [r for r in results if r is not None]

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
        if len(slots) != len(self.kv) or any(s.released for s in slots):
            raise ValueError(f"decode needs every running row: got {len(slots)} slots for {len(self.kv)} rows")
        chosen = list(adapters) if adapters is not None else [None] * len(slots)
        logits = self._forward(slots, [[token] for token in last_tokens], chosen)
        self.counts.decode += 1
        self.counts.max_decode_batch = max(self.counts.max_decode_batch, len(slots))
        return logits

    def remember(self, slot: Slot, ids: Sequence[int], adapter: LoraAdapter | None) -> bool:
        """Keeps a finishing sequence's keys and values for prompts that continue it; ``ids`` are
        the tokens the row holds (``slot.length`` of them)."""
        if slot.released or len(ids) != slot.length:
            return False
        keys, values = self.kv.row(slot)
        return self.prefixes.store(ids, adapter, keys, values)

    def _forward(
        self, slots: Sequence[Slot], feeds: Sequence[Sequence[int]], adapters: Sequence[LoraAdapter | None]
    ) -> torch.Tensor:
        """One pass feeding ``feeds[i]`` (at least one token) after ``slots[i]``'s tokens; the slots
        must be a block of consecutive rows. Returns the logits after each feed's last token, in
        the order of ``slots``.

        Feeds are right-aligned (the last token of every row in the last column); the padding
        before a shorter feed writes its keys one past that row's new end, a column no real
        token of the pass sees and the row's next token overwrites.
        """
        ordered = sorted(zip(slots, feeds, adapters, strict=True), key=lambda item: item[0].row)
        batch, first = len(ordered), ordered[0][0].row
        if [slot.row for slot, _, _ in ordered] != list(range(first, first + batch)):
            raise ValueError("a forward pass needs a block of consecutive rows")
        longest = max(len(feed) for feed in feeds)
        input_ids = torch.zeros((batch, longest), dtype=torch.long)
        positions = torch.empty((batch, longest), dtype=torch.long)
        for b, (slot, feed, _) in enumerate(ordered):
            pad, end = longest - len(feed), slot.length + len(feed)
            input_ids[b, pad:] = torch.tensor(feed, dtype=torch.long)
            positions[b, pad:] = torch.arange(slot.length, end)
            positions[b, :pad] = end
        width = int(positions.max()) + 1
        self.kv._reserve(len(self.kv), width)
        # A token at position p sees its row's tokens [0, p]: the cached ones, and the feed's up to itself.
        mask = (torch.arange(width) <= positions[:, :, None])[:, None]
        with self.lora.rows([adapter for _, _, adapter in ordered]):
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=_SlotsCache(self.kv, first, positions, width),
                use_cache=True,
                logits_to_keep=1,
            )
        for slot, feed in zip(slots, feeds, strict=True):
            slot.length += len(feed)
        logits = out.logits[:, -1].float()
        return logits[torch.tensor([s.row - first for s in slots])]


# A prefill pass may pad its feeds to at most this multiple of the tokens they hold.
PAD_LIMIT = 1.5


def _similar_lengths(longest_first: list[int], lengths: list[int]) -> Iterator[list[int]]:
    """Groups prompt indices (sorted by remaining length, longest first) into passes whose padded
    size stays within :data:`PAD_LIMIT` of their real tokens."""
    group: list[int] = []
    real = 0
    for i in longest_first:
        if group and (len(group) + 1) * lengths[group[0]] > PAD_LIMIT * (real + lengths[i]):
            yield group
            group, real = [], 0
        group.append(i)
        real += lengths[i]
    if group:
        yield group
