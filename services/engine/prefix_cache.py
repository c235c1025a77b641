"""The keys and values of finished sequences, kept so that a prompt continuing one is not prefilled again.

A multi-turn episode sends the whole conversation at every turn: the previous turn's prompt and
answer, then the tool's or the environment's observation. Without a cache the engine computes
the keys and values of every earlier token again at each turn; SGLang keeps them in its radix
cache and prefills only the new tokens. This cache does the same for the built-in engine: when a
sequence finishes, the KV blocks holding its keys and values (every token it fed the model) are
kept under its token ids, one more reference each in the :class:`~services.engine.kv_pool.BlockPool`,
and a new prompt that starts with those ids shares their whole blocks, copies the partial last
one, and is prefilled from there.

Lookup is by blocks of :data:`BLOCK_TOKENS` tokens: an entry is indexed under the chained hash of
each of its whole blocks (block k's key hashes block k with block k-1's key), so finding the
longest cached prefix of a prompt walks the prompt's blocks once, and the match is then checked
against the entry's ids and extended token by token past the last whole block. An entry whose
every block key a newer entry took (the same conversation one turn later) can never be found
again and is dropped at once; the rest are evicted least recently used first, past the byte
budget or when the pool runs out of free blocks.

Keys and values depend on the weights and on the LoRA adapter that computed them: entries are
per adapter object, and the engine clears the cache whenever its weights change (as SGLang
flushes its cache on a weight update). ``epoch`` counts those clears, so a sequence that was
running across one (partial rollout in place) is never stored: its cache mixes two versions.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from services.engine.kv_pool import BlockPool

# Tokens per indexed block: a prompt's cached prefix is found to the block, then to the token.
BLOCK_TOKENS = 16


@dataclass(eq=False)
class CachedPrefix:
    """One finished sequence: its token ids and the pool blocks holding their keys and values."""

    ids: list[int]
    adapter: object | None
    blocks: list[int]
    nbytes: int
    # Index keys that point here; at zero nothing can find the entry any more.
    index_keys: list[tuple[object, int]] = field(default_factory=list)
    live_keys: int = 0


class PrefixCache:
    """Finished sequences' blocks of ``pool`` within ``budget_bytes`` (0: keeps nothing)."""

    def __init__(self, budget_bytes: int, pool: BlockPool) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.pool = pool
        pool.reclaim = self.evict_oldest
        self._entries: OrderedDict[CachedPrefix, None] = OrderedDict()  # least recently used first
        self._index: dict[tuple[object, int], CachedPrefix] = {}
        self.nbytes = 0
        self.epoch = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int], adapter: object | None) -> tuple[CachedPrefix, int] | None:
        """The entry sharing the longest prefix with ``ids`` and that prefix's length (at most
        ``len(ids) - 1``: the last prompt token is always fed, for the logits it gives), or None."""
        found: tuple[CachedPrefix, int] | None = None
        for end, key in _block_keys(ids, adapter, len(ids) - 1):
            entry = self._index.get(key)
            if entry is None:
                break
            found = (entry, end)
        if found is None:
            return None
        entry, matched = found
        if entry.ids[:matched] != list(ids[:matched]):  # two blocks that hash alike
            return None
        limit = min(len(entry.ids), len(ids) - 1)
        while matched < limit and entry.ids[matched] == ids[matched]:
            matched += 1
        self._entries.move_to_end(entry)
        return entry, matched

    def store(self, ids: Sequence[int], adapter: object | None, blocks: Sequence[int]) -> bool:
        """Keeps the pool blocks ``blocks`` (a block table holding ``ids``' keys and values) under
        ``ids``, one more reference each; False when they are shorter than a block or larger than
        the whole budget."""
        held = list(blocks[: -(-len(ids) // self.pool.block_size)])
        nbytes = len(held) * self.pool.block_bytes
        if len(ids) < BLOCK_TOKENS or nbytes > self.budget_bytes:
            return False
        self.pool.retain(held)
        entry = CachedPrefix(list(ids), adapter, held, nbytes)
        for _, key in _block_keys(ids, adapter, len(ids)):
            previous = self._index.get(key)
            if previous is not None:
                previous.live_keys -= 1
                if previous.live_keys == 0:
                    self._drop(previous)
            self._index[key] = entry
            entry.index_keys.append(key)
            entry.live_keys += 1
        self._entries[entry] = None
        self.nbytes += nbytes
        while self.nbytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        """Forgets every entry (the weights changed) and starts a new epoch."""
        for entry in list(self._entries):
            self._drop(entry)
        self._index.clear()
        self.epoch += 1

    def evict_oldest(self) -> bool:
        """Drops the least recently used entry (the pool needs blocks); False when there is none."""
        if not self._entries:
            return False
        self._drop(next(iter(self._entries)))
        return True

    def _drop(self, entry: CachedPrefix) -> None:
        if entry not in self._entries:
            return
        del self._entries[entry]
        self.nbytes -= entry.nbytes
        self.pool.release(entry.blocks)
        for key in entry.index_keys:
            if self._index.get(key) is entry:
                del self._index[key]


def _block_keys(ids: Sequence[int], adapter: object | None, limit: int) -> Iterator[tuple[int, tuple[object, int]]]:
    """(end, key) of each whole block of ``ids[:limit]``, the key chaining every block before it."""
    chained = 0
    for end in range(BLOCK_TOKENS, limit + 1, BLOCK_TOKENS):
        chained = hash((chained, *ids[end - BLOCK_TOKENS : end]))
        yield end, (adapter, chained)
