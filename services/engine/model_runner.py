"""Forward passes over a Hugging Face causal LM whose keys and values live in a paged KV cache.

Running sequences hold block tables into one :class:`~services.engine.kv_pool.BlockPool`
(:class:`~services.engine.kv_pool.PagedKV`): a step writes each sequence's new keys and values
into its own blocks and attends through its table (:mod:`services.engine.attention`), so joining,
leaving or growing never moves another sequence's cache. A sequence that needs a block when none
is free gets one from the prefix cache (least recently used entry first); past that, the caller
gets :class:`~services.engine.kv_pool.OutOfBlocks` and decides whom to retract.

Prompts are prefilled in batched passes, each feeding a row its prompt tokens after whatever it
already holds: nothing, or a prefix of the prompt shared from the
:class:`~services.engine.prefix_cache.PrefixCache` (an earlier turn of the same conversation),
so a continued conversation is prefilled from its new tokens only. Decode steps go through the
device's :class:`~services.engine.device.DecodeRunner` (CUDA graphs on CUDA, eager on CPU).

Hidden positions are masked out and every row keeps its own position ids, so each row's logits
are the ones a lone forward pass over that sequence gives.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from relayrl.devices import upload
from services.engine.attention import (
    Q_BLOCK,
    AttentionBackend,
    PagedPass,
    PassInputs,
    backend_named,
    query_group,
    register,
)
from services.engine.device import DecodeRunner, EagerDecode
from services.engine.kv_pool import SCRATCH_BLOCK, BlockPool, KVLayout, OutOfBlocks, PagedKV, Slot
from services.engine.lora import LoraAdapter, LoraSet
from services.engine.prefix_cache import CachedPrefix, PrefixCache

__all__ = ["ForwardCounts", "ModelRunner", "OutOfBlocks", "Prefilled", "Slot"]


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


@dataclass(frozen=True, slots=True)
class Prefilled:
    """A prompt taken into the running rows: its row, its next-token logits (row ``row`` of its
    pass's ``batch_logits``), and how many of its tokens came from the prefix cache instead of the
    forward pass."""

    slot: Slot
    batch_logits: torch.Tensor
    row: int
    cached_tokens: int

    @property
    def logits(self) -> torch.Tensor:
        return self.batch_logits[self.row]


class ModelRunner:
    """The model and its paged KV cache: ``pool`` holds every running sequence's and every cached
    prefix's blocks; ``attention`` picks the backend (see :mod:`services.engine.attention`)."""

    def __init__(
        self,
        model: torch.nn.Module,
        pool: BlockPool | None = None,
        lora: LoraSet | None = None,
        prefix_cache_bytes: int = 0,
        attention: str | AttentionBackend = "torch_native",
        decoder: DecodeRunner | None = None,
    ) -> None:
        self.model = model
        self.model.set_attn_implementation(register())
        self.lora = lora if lora is not None else LoraSet(model)
        self.counts = ForwardCounts()
        self.device = next(model.parameters()).device
        self.pool = pool if pool is not None else default_pool(model, max_tokens=1 << 16)
        self.kv = PagedKV(self.pool)
        self.prefixes = PrefixCache(prefix_cache_bytes, self.pool)
        self.attention = (
            backend_named(attention, self.device, query_group(model)) if isinstance(attention, str) else attention
        )
        self.decoder = decoder if decoder is not None else EagerDecode()

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
        # Tokens each prompt still needs fed, past what the prefix cache gave.
        remaining = [len(p) - c for p, c in zip(prompts, cached, strict=True)]
        longest_first = sorted(range(len(prompts)), key=remaining.__getitem__, reverse=True)
        results: list[Prefilled | None] = [None] * len(prompts)
        taken: list[Slot] = []
        for group in _similar_lengths(longest_first, remaining):
            try:
                slots = [self.kv.add(hits[i][0].blocks if hits[i] else (), cached[i]) for i in group]
                taken.extend(slots)
                fed = [remaining[i] for i in group]
                input_ids = upload(_feed_ids([prompts[i][cached[i] :] for i in group], fed), self.device)
                logits = self._forward(slots, fed, input_ids, [chosen[i] for i in group])
            except OutOfBlocks:
                for slot in taken:  # all or nothing: the caller retries these prompts later
                    self.kv.release(slot)
                raise
            self.counts.prefill += 1
            for row, i in enumerate(group):
                results[i] = Prefilled(slots[row], logits, row, cached[i])
                self.counts.prefill_tokens += remaining[i]
                self.counts.cached_tokens += cached[i]
        return [r for r in results if r is not None]

    @torch.inference_mode()
    def decode(
        self,
        slots: Sequence[Slot],
        last_tokens: Sequence[int] | torch.Tensor,
        adapters: Sequence[LoraAdapter | None] | None = None,
    ) -> torch.Tensor:
        """Feeds one token per sequence in one batched pass.

        ``last_tokens`` may be a ``[B]`` tensor on the model's device (the tokens a step sampled,
        which the pass then reads without their coming back to the host first). Each slot grows by
        one token, with the LoRA adapter ``adapters`` names for it (None: the base model). Returns
        next-token logits ``[len(slots), V]`` in the order of ``slots``; raises
        :class:`OutOfBlocks` (nothing fed) when a slot needs a block and none is left.
        """
        if any(s.released for s in slots):
            raise ValueError("decode was given a released slot")
        chosen = list(adapters) if adapters is not None else [None] * len(slots)
        if isinstance(last_tokens, torch.Tensor):
            input_ids = last_tokens.reshape(-1, 1)
        else:
            input_ids = upload(np.array(last_tokens, np.int64).reshape(-1, 1), self.device)
        logits = self._forward(slots, [1] * len(slots), input_ids, chosen, decode=True)
        self.counts.decode += 1
        self.counts.max_decode_batch = max(self.counts.max_decode_batch, len(slots))
        return logits

    @torch.inference_mode()
    def warm_up(self, context_length: int) -> int:
        """Runs one pass of each shape class a request can bring, before any request does, and
        returns how many: a kernel that compiles at first use (``flex_attention`` under
        ``torch.compile``, Triton's) then takes its general form at start instead of stalling the
        first requests. ``torch.compile`` specialises sizes 1, so the classes are one row and
        several, by a query of one token, of a few, and of more than one flex_attention query
        block. Nothing stays behind: the rows are released, no counter or cache sees them.
        """
        lengths = sorted({1, 2, min(Q_BLOCK + 1, context_length - 1)})
        passes = 0
        for rows in (1, 2):
            for length in lengths:
                slots = [self.kv.add() for _ in range(rows)]
                try:
                    input_ids = torch.zeros((rows, length), dtype=torch.long, device=self.device)
                    self._forward(slots, [length] * rows, input_ids, [None] * rows)
                finally:
                    for slot in slots:
                        self.kv.release(slot)
                passes += 1
        return passes

    def remember(self, slot: Slot, ids: Sequence[int], adapter: LoraAdapter | None) -> bool:
        """Keeps a finishing sequence's keys and values for prompts that continue it; ``ids`` are
        the tokens the row holds (``slot.length`` of them)."""
        if slot.released or len(ids) != slot.length:
            return False
        return self.prefixes.store(ids, adapter, slot.blocks)

    def _forward(
        self,
        slots: Sequence[Slot],
        fed: Sequence[int],
        input_ids: torch.Tensor,
        adapters: Sequence[LoraAdapter | None],
        decode: bool = False,
    ) -> torch.Tensor:
        """One pass feeding ``fed[i]`` tokens (at least one), row ``i`` of ``input_ids`` on the
        device, after ``slots[i]``'s tokens; returns the logits after each feed's last token, in
        the order of ``slots``.

        Feeds are right-aligned (the last token of every row in the last column); the padding
        before a shorter feed sits at position 0 and writes to the scratch block.
        """
        for slot, count in zip(slots, fed, strict=True):
            self.kv.reserve(slot, slot.length + count)
        arrays = _pass_arrays(self.kv, slots, np.array(fed, np.int64))
        positions, write_index, tables, lengths = (upload(array, self.device) for array in arrays)
        inputs = PassInputs(write_index, tables, positions, lengths, int(arrays[-1].max()))
        with self.lora.rows(list(adapters)):
            if decode and not any(adapters):
                logits = self.decoder.run(self, input_ids, positions, inputs)
            else:
                logits = self.forward_logits(input_ids, positions, inputs)
        for slot, count in zip(slots, fed, strict=True):
            slot.length += count
        return logits

    def forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """The model's last-column logits ``[B, V]`` for one pass planned by ``inputs``, in the model's
        dtype: the samplers compute in float32 as they read, so an upcast here would be one more
        ``[B, V]`` copy each pass (and a CUDA graph's output twice the size)."""
        paged = PagedPass(self.pool, self.attention, self.attention.plan(self.pool, inputs), inputs.write_index_BL)
        out = self.model(
            input_ids=input_ids, position_ids=positions, use_cache=False, logits_to_keep=1, relayrl_pass=paged
        )
        return out.logits[:, -1]


def default_pool(model: torch.nn.Module, max_tokens: int, block_size: int = 16) -> BlockPool:
    """A pool for ``model`` of up to ``max_tokens`` tokens that claims its memory as it is needed."""
    return BlockPool(KVLayout.of(model), block_size, max(2, -(-max_tokens // block_size) + 1), initial_blocks=64)


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


def _feed_ids(feeds: Sequence[Sequence[int]], fed: Sequence[int]) -> np.ndarray:
    """The token ids of a pass's feeds (``fed[i]`` tokens each), ``[B, L]`` right-aligned and padded
    with 0 before."""
    fed_B = np.array(fed, np.int64)
    longest = int(fed_B.max())
    input_ids = np.zeros((len(feeds), longest), np.int64)
    input_ids[np.arange(longest) >= (longest - fed_B)[:, None]] = np.fromiter(
        itertools.chain.from_iterable(feeds), np.int64, int(fed_B.sum())
    )
    return input_ids


def _pass_arrays(kv: PagedKV, slots: Sequence[Slot], fed_B: np.ndarray) -> tuple[np.ndarray, ...]:
    """A pass's inputs on the host besides its token ids: positions and KV write indices ``[B, L]``,
    block tables ``[B, N]`` and lengths after the pass ``[B]``, for feeds of ``fed_B`` tokens
    right-aligned as :meth:`ModelRunner._forward` describes.

    Built with numpy over the whole batch: a row costs a few list items, not a few tensor
    operations, which at hundreds of rows a step would outlast the GPU's pass.
    """
    held_B = np.fromiter((slot.length for slot in slots), np.int64, len(slots))
    longest = int(fed_B.max())
    pad_B1 = (longest - fed_B)[:, None]
    column_L = np.arange(longest)
    real_BL = column_L >= pad_B1
    positions = np.where(real_BL, held_B[:, None] + column_L - pad_B1, 0)
    tables = kv.tables(slots)
    write_index = np.where(real_BL, kv.pool.token_index(tables, positions), SCRATCH_BLOCK * kv.pool.block_size)
    return positions, write_index, tables, held_B + fed_B
