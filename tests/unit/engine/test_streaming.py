"""The pieces of the engine's streaming and of its bench that need no engine process: the text of a
growing output decoded a few tokens at a time (and the decoder it uses), a stream's chunks, the
bench's reading of a stream's timing, and the KV cache's room on a GPU (device-independent arithmetic)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path

import pytest
import torch

from relayrl.config import SettingsError
from services.engine.bench import read_stream
from services.engine.device import addressable_tokens, cache_tokens, cuda_cache_tokens
from services.engine.kv_pool import KVLayout
from services.engine.sampling import SamplingConfig
from services.engine.scheduler import Sequence, version_spans
from services.engine.state import text_decoder
from services.engine.streaming import IncrementalText, SampleStream, TextDecoder


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from relayrl.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_incremental_text_equals_the_whole_decode_and_never_shows_half_a_character(tokenizer) -> None:
    text = "héllo wörld ✓ done"
    ids = tokenizer(text)["input_ids"]
    incremental = IncrementalText(lambda part: tokenizer.decode(part, skip_special_tokens=True))

    # The list may already hold more than the count to decode (the scheduler appends as it goes).
    seen = [incremental.update(ids, i + 1) for i in range(len(ids))]

    assert seen[-1] == text
    assert all("\ufffd" not in part for part in seen)
    # Each step's text extends the previous one: a client appending deltas gets the whole text.
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(seen))


def test_ids_the_tokenizer_lacks_are_left_out_so_the_decoded_window_stays_a_few_tokens(tokenizer) -> None:
    # The random base preset: 151,936 output rows over this 259-id tokenizer, so nearly every sampled id
    # is one the tokenizer does not have, and decodes to nothing.
    decoder = text_decoder(tokenizer)
    assert decoder.known == len(tokenizer)
    rng = random.Random(0)
    ids = [rng.randrange(151936) for _ in range(2000)] + tokenizer("héllo ✓")["input_ids"]
    slices: list[int] = []

    def decode(part: list[int]) -> str:
        slices.append(len(part))
        return decoder.decode(part)

    stream = IncrementalText(decode, decoder.known)
    shown = [stream.update(ids, count) for count in range(1, len(ids) + 1)]

    assert shown[-1] == decoder.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(shown))
    # Without leaving them out each chunk decoded every id since the last visible text: thousands.
    assert max(slices) <= 8


def _line(chunk: dict | str) -> bytes:
    return b"data: " + (chunk.encode() if isinstance(chunk, str) else json.dumps(chunk).encode())


def test_a_streams_timing_counts_each_token_once_and_spreads_a_chunks_gap_over_its_tokens() -> None:
    lines = [
        (1.5, _line({"text": "a", "output_ids": [7], "meta_info": {"finish_reason": None}})),
        (1.5, b""),
        (1.7, _line({"text": "bc", "output_ids": [8, 9], "meta_info": {"finish_reason": None}})),
        (2.0, _line({"text": "d", "output_ids": [10], "meta_info": {"finish_reason": {"type": "length"}}})),
        (2.0, _line("[DONE]")),
    ]

    timing = read_stream(lines, sent_at=1.0)

    assert timing.tokens == 4
    assert timing.ttft_s == pytest.approx(0.5)
    assert timing.itl_s == pytest.approx([0.1, 0.1, 0.3])


def test_a_stream_that_reports_an_error_fails_the_bench() -> None:
    with pytest.raises(RuntimeError, match="bad prompt"):
        read_stream([(1.0, _line({"error": {"message": "bad prompt"}}))], sent_at=0.0)


GIB = 2**30


def test_the_kv_cache_gets_the_free_memory_less_what_the_fraction_keeps_for_others() -> None:
    # 80 GiB card, 70 GiB free after the weights; 0.9 keeps 8 GiB for others: 62 GiB of cache.
    tokens = cache_tokens(70 * GIB, 80 * GIB, 0.9, bytes_per_token=12 * 1024, context_length=32768)

    assert tokens == 62 * GIB // (12 * 1024)


@pytest.mark.parametrize("fraction", [0.05, 0.5])
def test_a_fraction_that_leaves_less_than_one_context_names_the_setting_on_one_line(fraction: float) -> None:
    # 80 GiB card with 41 GiB free: 0.5 keeps 40 GiB for others, leaving 1 GiB < one 128k context at 12 KiB a token.
    with pytest.raises(SettingsError) as err:
        cache_tokens(41 * GIB, 80 * GIB, fraction, bytes_per_token=12 * 1024, context_length=131072)

    line = err.value.one_line()
    assert "\n" not in line
    assert f"RELAYRL_ENGINE_MEM_FRACTION_STATIC={fraction}" in line and "no room for the KV cache" in line


# The tiny preset's layout in float32: 1 KiB a token, 32 elements a token in one layer's keys.
TINY = KVLayout(layers=4, kv_heads=2, head_dim=16, dtype=torch.float32)


def test_a_cuda_cache_stops_where_32_bit_offsets_end_though_the_memory_fraction_leaves_more() -> None:
    # An H200's 0.88 leaves about 131 GB after the tiny model: 128 M tokens, 4.1 G elements a layer.
    tokens = cuda_cache_tokens(TINY, 128, 2048, 0, 0.88, free=149 * 10**9, total=150_754_820_096)

    assert tokens == addressable_tokens(TINY, 128) < 149 * 10**9 // TINY.bytes_per_token
    blocks = tokens // 128 + 1  # and the scratch block
    assert blocks * 128 * TINY.kv_heads * TINY.head_dim < 2**31
    assert (blocks + 1) * 128 * TINY.kv_heads * TINY.head_dim >= 2**31


def test_a_real_models_cuda_cache_is_what_the_memory_fraction_leaves() -> None:
    qwen_05b = KVLayout(layers=24, kv_heads=2, head_dim=64, dtype=torch.bfloat16)

    tokens = cuda_cache_tokens(qwen_05b, 128, 32768, 0, 0.88, free=148 * 10**9, total=150_754_820_096)

    assert tokens == cache_tokens(148 * 10**9, 150_754_820_096, 0.88, qwen_05b.bytes_per_token, 32768)


def test_a_max_total_tokens_past_32_bit_offsets_names_the_setting_on_one_line() -> None:
    with pytest.raises(SettingsError) as err:
        cuda_cache_tokens(TINY, 128, 2048, 100_000_000, 0.88, free=0, total=0)

    line = err.value.one_line()
    assert "\n" not in line and "RELAYRL_ENGINE_MAX_TOTAL_TOKENS=100000000" in line
    assert cuda_cache_tokens(TINY, 128, 2048, 1_000_000, 0.88, free=0, total=0) == 1_000_000


async def test_a_streams_chunks_carry_their_tokens_weight_versions_while_later_tokens_extend_them() -> None:
    loop = asyncio.get_running_loop()
    seq = Sequence(
        rid="r",
        parent_rid="r",
        prompt_ids=[1],
        config=SamplingConfig(),
        return_logprob=True,
        loop=loop,
        future=loop.create_future(),
    )
    text = TextDecoder(lambda ids: "".join(chr(97 + i) for i in ids))
    stream = SampleStream(seq, text, None, incremental=True, interval=1)
    chunks = stream.chunks()
    sent = []
    for token, version in enumerate(["1", "1", "2", "2", "3"]):
        # As the scheduler thread appends: the version last.
        seq.output_ids.append(token)
        seq.logprobs.append(-0.5 - token)
        seq.token_versions.append(version)
        seq.on_tokens()
        sent.append(await anext(chunks))

    # Each chunk's spans are those of its tokens so far, unchanged by the spans growing after it was sent.
    assert [chunk["meta_info"]["weight_versions"] for chunk in sent] == [
        version_spans(seq.token_versions[:count], "") for count in range(1, 6)
    ]
    assert [chunk["output_ids"] for chunk in sent] == [[0], [1], [2], [3], [4]]
    assert [chunk["meta_info"]["output_token_logprobs"] for chunk in sent] == [
        [[-0.5 - token, token, None]] for token in range(5)
    ]
    assert "".join(chunk["text"] for chunk in sent) == "abcde"


def test_the_engines_text_is_the_tokenizers_decode_without_special_tokens(tokenizer) -> None:
    ids = tokenizer("<|im_start|>assistant\nhéllo ✓<|im_end|>")["input_ids"]
    fast = text_decoder(tokenizer)
    # The fast path is the Rust tokenizer's own decode, not transformers' wrapper around it.
    assert fast.decode.func == tokenizer.backend_tokenizer.decode
    assert fast.decode(ids) == tokenizer.decode(ids, skip_special_tokens=True) == "assistant\nhéllo ✓"

    tokenizer.clean_up_tokenization_spaces = True  # a clean-up only transformers' decode does
    try:
        slow = text_decoder(tokenizer)
        # transformers' own decode may not drop unknown ids as the Rust one does: nothing is left out.
        assert slow.decode.func == tokenizer.decode and slow.known is None
    finally:
        tokenizer.clean_up_tokenization_spaces = False
