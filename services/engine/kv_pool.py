"""The paged KV cache: one pool of fixed-size blocks per layer, and each sequence's block table.

Every layer keeps its keys and its values in one tensor each, ``[kv_heads, blocks · block_size,
head_dim]``: token ``t`` of a sequence lives at flat index ``table[t // block_size] · block_size
+ t % block_size`` of its block table ``table``. Blocks are counted references: a second sample
of a prompt (a fork) and a prompt continuing a cached sequence (the prefix cache) share the
whole blocks they have in common, and copy only the last, partly filled one, so no two holders
ever write into one block. Block 0 is a scratch block no sequence owns: padding tokens of a
batched pass write their keys there.

On CPU the pool claims memory as it is needed (doubling up to its limit, each growth one copy);
on CUDA it is allocated once at its full size, so CUDA graphs can hold its address.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

SCRATCH_BLOCK = 0


@dataclass(frozen=True, slots=True)
class KVLayout:
    """The shape of one token's keys and values across the model."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def bytes_per_token(self) -> int:
        # The dtype's own size, not a tensor's: the scheduler reads this at every step.
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize

    @classmethod
    def of(cls, model: torch.nn.Module) -> KVLayout:
        config = model.config
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        param = next(model.parameters())
        return cls(int(config.num_hidden_layers), kv_heads, int(head_dim), param.dtype, param.device)


class OutOfBlocks(RuntimeError):
    """The pool has no free block left, even after the prefix cache gave back what it could."""


class BlockPool:
    """``max_blocks`` blocks of ``block_size`` tokens (block 0 the scratch block), ``initial_blocks`` of them
    allocated now; the rest are claimed by doubling when needed."""

    def __init__(self, layout: KVLayout, block_size: int, max_blocks: int, initial_blocks: int | None = None) -> None:
        if block_size < 1 or max_blocks < 2:
            raise ValueError(f"a pool needs block_size >= 1 and at least 2 blocks, got {block_size} and {max_blocks}")
        self.layout, self.block_size, self.max_blocks = layout, block_size, max_blocks
        self.capacity = min(max_blocks, max(2, initial_blocks or max_blocks))
        shape = (layout.kv_heads, self.capacity * block_size, layout.head_dim)
        self.keys = [self._zeros(shape) for _ in range(layout.layers)]
        self.values = [self._zeros(shape) for _ in range(layout.layers)]
        self.refs = [0] * self.capacity
        self.refs[SCRATCH_BLOCK] = 1
        # A stack: the lowest free block is taken first, so a CPU pool's tail stays untouched.
        self.free = list(range(self.capacity - 1, SCRATCH_BLOCK, -1))
        # Asked for blocks when none is free (the prefix cache evicts); returns whether it freed any.
        self.reclaim: Callable[[], bool] = lambda: False
        self.growths = 0
        # Most blocks held at once since start (the bench's "KV blocks used").
        self.peak_used = 0

    def _zeros(self, shape: tuple[int, ...]) -> torch.Tensor:
        # Zeros, not empty: a gathered position past a sequence's end is masked, and 0 · NaN would not be.
        return torch.zeros(shape, dtype=self.layout.dtype, device=self.layout.device)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.layout.bytes_per_token

    @property
    def used_blocks(self) -> int:
        """Blocks some sequence or cache entry holds (the scratch block not counted)."""
        return self.capacity - 1 - len(self.free)

    def available(self) -> int:
        """Blocks that can still be handed out without reclaiming any."""
        return len(self.free) + self.max_blocks - self.capacity

    def allocate(self, count: int) -> list[int]:
        """``count`` fresh blocks, each with one reference; raises :class:`OutOfBlocks` (taking none)."""
        while len(self.free) < count:
            if self.capacity < self.max_blocks:
                self._grow(count)
            elif not self.reclaim():
                raise OutOfBlocks(f"{count} KV blocks wanted, {len(self.free)} free of {self.max_blocks - 1}")
        taken = [self.free.pop() for _ in range(count)]
        for block in taken:
            self.refs[block] = 1
        self.peak_used = max(self.peak_used, self.used_blocks)
        return taken

    def retain(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            assert self.refs[block] > 0, f"block {block} is free"
            self.refs[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            assert self.refs[block] > 0 and block != SCRATCH_BLOCK, f"block {block} released too often"
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free.append(block)

    @torch.inference_mode()
    def copy_tokens(self, source: int, target: int, tokens: int) -> None:
        """Copies the first ``tokens`` tokens of block ``source`` into block ``target``."""
        src = slice(source * self.block_size, source * self.block_size + tokens)
        dst = slice(target * self.block_size, target * self.block_size + tokens)
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[:, dst] = buffer[:, src]

    def token_index(self, tables_BN: np.ndarray, positions_BL: np.ndarray) -> np.ndarray:
        """Flat pool indices of each row's ``positions_BL`` in the sequence whose block table is that
        row of ``tables_BN`` (host arrays: a pass's inputs are built on the host)."""
        blocks_BL = np.take_along_axis(tables_BN, positions_BL // self.block_size, axis=1)
        return blocks_BL * self.block_size + positions_BL % self.block_size

    @torch.inference_mode()
    def write(self, layer: int, index_BL: torch.Tensor, key_BHLD: torch.Tensor, value_BHLD: torch.Tensor) -> None:
        """Stores one pass's new keys and values of ``layer`` at the flat indices ``index_BL``."""
        flat = index_BL.reshape(-1)
        kv_heads, head_dim = key_BHLD.shape[1], key_BHLD.shape[3]
        self.keys[layer][:, flat] = key_BHLD.transpose(0, 1).reshape(kv_heads, -1, head_dim)
        self.values[layer][:, flat] = value_BHLD.transpose(0, 1).reshape(kv_heads, -1, head_dim)

    @torch.inference_mode()
    def _grow(self, wanted: int) -> None:
        new_capacity = min(self.max_blocks, max(2 * self.capacity, self.capacity + wanted - len(self.free)))
        tokens = self.capacity * self.block_size
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                grown = self._zeros((old.shape[0], new_capacity * self.block_size, old.shape[2]))
                grown[:, :tokens] = old
                buffers[layer] = grown
        self.free = list(range(new_capacity - 1, self.capacity - 1, -1)) + self.free
        self.refs.extend([0] * (new_capacity - self.capacity))
        self.capacity = new_capacity
        self.growths += 1


@dataclass(eq=False, slots=True)
class Slot:
    """A running sequence's place in the pool: its block table, how many tokens it holds, and its
    row of :class:`PagedKV`'s table array."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0
    released: bool = False
    row: int = -1


class PagedKV:
    """The running sequences' block tables over one :class:`BlockPool`.

    Besides each slot's list, every table is kept as one row of a host array padded with the
    scratch block, written as blocks are taken: a pass takes its rows' tables in one indexing
    instead of flattening every row's list again each step (a third of a millisecond of a decode
    step's host work at 256 rows of 70 blocks, measured on the CPU machine).
    """

    def __init__(self, pool: BlockPool) -> None:
        self.pool = pool
        self.slots: list[Slot] = []
        self._tables = np.full((8, 8), SCRATCH_BLOCK, np.int64)
        self._free_rows = list(range(len(self._tables) - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.slots)

    def add(self, shared: Sequence[int] = (), length: int = 0) -> Slot:
        """A new sequence holding the first ``length`` tokens of the blocks ``shared`` (a cached
        prefix): its whole blocks are shared, the partial last one copied."""
        slot = Slot()
        self._take(slot, shared, length)
        if not self._free_rows:
            rows = len(self._tables)
            self._tables = np.vstack([self._tables, np.full_like(self._tables, SCRATCH_BLOCK)])
            self._free_rows = list(range(2 * rows - 1, rows - 1, -1))
        slot.row = self._free_rows.pop()
        self._write(slot, 0)
        self.slots.append(slot)
        return slot

    def fork(self, slot: Slot) -> Slot:
        """A new sequence holding ``slot``'s tokens (another sample of the same prompt)."""
        return self.add(slot.blocks, slot.length)

    def reserve(self, slot: Slot, length: int) -> None:
        """Gives ``slot`` blocks for ``length`` tokens; raises :class:`OutOfBlocks` (taking none)."""
        missing = -(-length // self.pool.block_size) - len(slot.blocks)
        if missing > 0:
            held = len(slot.blocks)
            slot.blocks.extend(self.pool.allocate(missing))
            self._write(slot, held)

    def tables(self, slots: Sequence[Slot]) -> np.ndarray:
        """The block tables of ``slots`` as one ``[B, longest]`` host array padded with the scratch block."""
        rows = np.fromiter((slot.row for slot in slots), np.int64, len(slots))
        return self._tables[rows, : max(1, max(len(slot.blocks) for slot in slots))]

    def release(self, slot: Slot) -> None:
        if slot.released:
            return
        slot.released = True
        self.pool.release(slot.blocks)
        self._tables[slot.row, : len(slot.blocks)] = SCRATCH_BLOCK
        self._free_rows.append(slot.row)
        slot.blocks = []
        self.slots.remove(slot)

    def clear(self) -> None:
        """Drops every sequence (after a failed step, whose blocks may be half-written)."""
        for slot in list(self.slots):
            self.release(slot)

    def _write(self, slot: Slot, start: int) -> None:
        """Copies ``slot``'s blocks from ``start`` on into its row of the table array."""
        width = len(self._tables[0])
        if len(slot.blocks) > width:
            grown = max(2 * width, len(slot.blocks))
            self._tables = np.hstack(
                [self._tables, np.full((len(self._tables), grown - width), SCRATCH_BLOCK, np.int64)]
            )
        self._tables[slot.row, start : len(slot.blocks)] = slot.blocks[start:]

    def _take(self, slot: Slot, shared: Sequence[int], length: int) -> None:
        whole, partial = divmod(length, self.pool.block_size)
        # The partial block is held too until it is copied: reclaiming blocks for the copy may drop its entry.
        held = list(shared[: whole + (1 if partial else 0)])
        self.pool.retain(held)
        slot.blocks = held[:whole]
        if partial:
            try:
                (copy,) = self.pool.allocate(1)
            except OutOfBlocks:
                self.pool.release(held)
                raise
            self.pool.copy_tokens(held[whole], copy, partial)
            self.pool.release(held[whole:])
            slot.blocks.append(copy)
        slot.length = length
