"""Two CPU ranks gather row-sharded tensors through shared memory: every full tensor equals the
original bit for bit, however its rows split, and one larger than a bucket comes in row ranges of
at most a bucket each; a bucket the consumer still holds is never overwritten by a later gather;
and buckets dropped as they are consumed give their buffers back, so a streamed publish needs no
new memory version after version; when rank 0 cannot make a buffer, the all-gather serves
instead."""

from __future__ import annotations

import asyncio
import json

from tests.integration.trainer.harness import run_logged, torchrun


async def test_shared_memory_gather_is_exact_keeps_held_buckets_reuses_freed_buffers_and_falls_back(tmp_path):
    out = tmp_path / "gathered.json"
    cmd = torchrun(2, "tests.integration.trainer.host_gather_worker", str(out))
    await asyncio.to_thread(run_logged, cmd, tmp_path / "gather.log")
    seen = json.loads(out.read_text())
    assert seen["shared"], "both ranks run on this host"
    assert seen["buckets"] >= 3, "the bucket size must split the tensors, else reuse proves nothing"
    assert len(seen["wide_pieces"]) > 1 and max(seen["wide_pieces"]) <= 64, "split to the bucket size"
    assert sum(seen["wide_pieces"]) == 64 * 16 * 4
    assert seen["first_equal"] == [True] * 4
    assert seen["second_equal"] == [True] * 4
    assert seen["streamed_equal"] == [True] * 4
    # Every bucket of both held gathers needed a buffer of its own...
    assert seen["buffers_kept"] == 2 * seen["buckets"]
    # ...and once they were dropped, the streamed gather took its buffers from those.
    assert seen["buffers_after_streaming"] == seen["buffers_kept"]
    # With no buffer to be had, the buckets are all-gathered instead, as exact.
    assert seen["fallback_equal"] == [True] * 4
    assert seen["buffers_after_fallback"] == seen["buffers_kept"]
