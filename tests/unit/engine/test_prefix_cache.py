"""The prefix cache's index and budget: what it finds, what it keeps, what it lets go."""

from __future__ import annotations

import torch

from services.engine.prefix_cache import BLOCK_TOKENS, PrefixCache

# Two layers, one KV head of width 4, float32: 2 · 2 · 4 · 4 = 64 bytes per token.
BYTES_PER_TOKEN = 64


def kv(ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Keys and values that carry their token ids, so a test can tell whose it got."""
    rows = torch.tensor(ids, dtype=torch.float32)[None, :, None].expand(1, len(ids), 4).contiguous()
    return [rows, rows + 0.5], [-rows, -rows - 0.5]


def store(cache: PrefixCache, ids: list[int], adapter: object | None = None) -> bool:
    return cache.store(ids, adapter, *kv(ids))


def test_the_longest_cached_prefix_is_found_and_its_keys_are_the_stored_ones() -> None:
    cache = PrefixCache(1 << 20)
    conversation = list(range(100, 150))
    assert store(cache, conversation)
    entry, matched = cache.lookup([*conversation, 7, 8], None)
    assert matched == len(conversation)
    torch.testing.assert_close(entry.keys[0][0, :, 0], torch.tensor(conversation, dtype=torch.float32))
    assert cache.lookup(conversation[:20] + [1] * 30, None)[1] == 20  # diverges inside the second block
    assert cache.lookup(list(range(200, 250)), None) is None
    assert cache.lookup(conversation[:BLOCK_TOKENS], None) is None  # a whole block is never all cached


def test_sequences_shorter_than_a_block_or_the_budget_are_not_kept() -> None:
    cache = PrefixCache(40 * BYTES_PER_TOKEN)
    assert not store(cache, list(range(BLOCK_TOKENS - 1)))
    assert not store(cache, list(range(41)))
    assert len(cache) == 0 and cache.nbytes == 0


def test_an_earlier_turn_a_later_one_covers_is_dropped_at_once() -> None:
    cache = PrefixCache(1 << 20)
    turn1 = list(range(40))
    store(cache, turn1)
    store(cache, turn1 + [99] * 20)  # the same conversation one turn later: every block key of turn 1 taken
    assert len(cache) == 1
    assert cache.nbytes == 60 * BYTES_PER_TOKEN


def test_the_least_recently_used_go_first_past_the_budget() -> None:
    cache = PrefixCache(100 * BYTES_PER_TOKEN)
    a, b, c = ([k] * 40 for k in (1, 2, 3))
    store(cache, a)
    store(cache, b)
    assert cache.lookup([*a, 0], None) is not None  # a is now the more recently used
    store(cache, c)
    assert cache.nbytes <= 100 * BYTES_PER_TOKEN
    assert cache.lookup([*b, 0], None) is None
    assert cache.lookup([*a, 0], None) is not None and cache.lookup([*c, 0], None) is not None


def test_entries_are_per_adapter_and_a_clear_forgets_them_all() -> None:
    cache = PrefixCache(1 << 20)
    adapter = object()
    ids = list(range(40))
    store(cache, ids, adapter)
    assert cache.lookup([*ids, 1], None) is None
    assert cache.lookup([*ids, 1], adapter) is not None
    epoch = cache.epoch
    cache.clear()
    assert cache.lookup([*ids, 1], adapter) is None
    assert len(cache) == 0 and cache.nbytes == 0 and cache.epoch == epoch + 1
