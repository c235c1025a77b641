"""The prefix cache's index and budget: what it finds, what it keeps, what it lets go."""

from __future__ import annotations

import torch

from services.engine.kv_pool import BlockPool, KVLayout
from services.engine.prefix_cache import BLOCK_TOKENS, PrefixCache

# Two layers, one KV head of width 4, float32: 2 · 2 · 4 · 4 = 64 bytes per token, one token a block.
BYTES_PER_TOKEN = 64


def new_cache(budget_bytes: int) -> PrefixCache:
    return PrefixCache(budget_bytes, BlockPool(KVLayout(2, 1, 4, torch.float32), block_size=1, max_blocks=1024))


def store(cache: PrefixCache, ids: list[int], adapter: object | None = None) -> bool:
    """Stores a finished sequence whose keys carry its token ids, as the engine does: the sequence
    holds its blocks, the cache takes a reference, the sequence lets go."""
    blocks = cache.pool.allocate(len(ids))
    cache.pool.keys[0][0, blocks, 0] = torch.tensor(ids, dtype=torch.float32)
    kept = cache.store(ids, adapter, blocks)
    cache.pool.release(blocks)
    return kept


def test_the_longest_cached_prefix_is_found_and_its_keys_are_the_stored_ones() -> None:
    cache = new_cache(1 << 20)
    conversation = list(range(100, 150))
    assert store(cache, conversation)
    entry, matched = cache.lookup([*conversation, 7, 8], None)
    assert matched == len(conversation)
    torch.testing.assert_close(cache.pool.keys[0][0, entry.blocks, 0], torch.tensor(conversation, dtype=torch.float32))
    assert cache.lookup(conversation[:20] + [1] * 30, None)[1] == 20  # diverges inside the second block
    assert cache.lookup(list(range(200, 250)), None) is None
    assert cache.lookup(conversation[:BLOCK_TOKENS], None) is None  # a whole block is never all cached


def test_sequences_shorter_than_a_block_or_the_budget_are_not_kept() -> None:
    cache = new_cache(40 * BYTES_PER_TOKEN)
    assert not store(cache, list(range(BLOCK_TOKENS - 1)))
    assert not store(cache, list(range(41)))
    assert len(cache) == 0 and cache.nbytes == 0


def test_an_earlier_turn_a_later_one_covers_is_dropped_at_once() -> None:
    cache = new_cache(1 << 20)
    turn1 = list(range(40))
    store(cache, turn1)
    store(cache, turn1 + [99] * 20)  # the same conversation one turn later: every block key of turn 1 taken
    assert len(cache) == 1
    assert cache.nbytes == 60 * BYTES_PER_TOKEN


def test_the_least_recently_used_go_first_past_the_budget() -> None:
    cache = new_cache(100 * BYTES_PER_TOKEN)
    a, b, c = ([k] * 40 for k in (1, 2, 3))
    store(cache, a)
    store(cache, b)
    assert cache.lookup([*a, 0], None) is not None  # a is now the more recently used
    store(cache, c)
    assert cache.nbytes <= 100 * BYTES_PER_TOKEN
    assert cache.lookup([*b, 0], None) is None
    assert cache.lookup([*a, 0], None) is not None and cache.lookup([*c, 0], None) is not None


def test_entries_are_per_adapter_and_a_clear_forgets_them_all() -> None:
    cache = new_cache(1 << 20)
    adapter = object()
    ids = list(range(40))
    store(cache, ids, adapter)
    assert cache.lookup([*ids, 1], None) is None
    assert cache.lookup([*ids, 1], adapter) is not None
    epoch = cache.epoch
    cache.clear()
    assert cache.lookup([*ids, 1], adapter) is None
    assert len(cache) == 0 and cache.nbytes == 0 and cache.epoch == epoch + 1
    assert cache.pool.used_blocks == 0, "a cleared cache holds no KV block"


def test_a_pool_out_of_blocks_takes_them_from_the_least_recently_used_entry() -> None:
    cache = new_cache(1 << 20)
    a, b = [1] * 40, [2] * 40
    store(cache, a)
    store(cache, b)
    cache.pool.allocate(cache.pool.available())  # every never-used block taken
    assert cache.pool.allocate(30)  # only entries held the rest: the older one gives its 40 blocks back
    assert cache.lookup([*a, 0], None) is None and cache.lookup([*b, 0], None) is not None
