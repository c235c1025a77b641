"""A pass reads every running sequence's block table from :class:`PagedKV`'s table array: each row
must be that sequence's blocks padded with the scratch block, whatever joined, forked, grew or
left before (a stale block in a row would have a pass read another sequence's keys)."""

from __future__ import annotations

import random

import numpy as np
import torch

from services.engine.kv_pool import SCRATCH_BLOCK, BlockPool, KVLayout, PagedKV, Slot


def padded(slots: list[Slot]) -> np.ndarray:
    width = max(1, max(len(slot.blocks) for slot in slots))
    return np.array([slot.blocks + [SCRATCH_BLOCK] * (width - len(slot.blocks)) for slot in slots])


def test_the_table_array_holds_each_slots_blocks_through_joins_forks_growth_and_releases() -> None:
    pool = BlockPool(KVLayout(1, 1, 2, torch.float32), block_size=4, max_blocks=4096, initial_blocks=8)
    kv = PagedKV(pool)
    rng = random.Random(0)
    live: list[Slot] = []
    for _ in range(600):
        action = rng.random()
        if action < 0.3 or not live:
            live.append(kv.add())
        elif action < 0.4:
            live.append(kv.fork(rng.choice(live)))
        elif action < 0.8:
            slot = rng.choice(live)
            slot.length += rng.randint(1, 30)
            kv.reserve(slot, slot.length)
        else:
            slot = live.pop(rng.randrange(len(live)))
            kv.release(slot)
        if live:
            order = rng.sample(live, len(live))
            np.testing.assert_array_equal(kv.tables(order), padded(order))
    # The run grew the array past its first 8 rows and 8 columns, and reused released rows.
    assert max(len(slot.blocks) for slot in live) > 8 and len(live) > 8
