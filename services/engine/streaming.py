"""``/generate`` with ``stream: true``: SGLang's server-sent events, chunk for chunk.

SGLang's HTTP server answers a streamed ``/generate`` with ``text/event-stream``: one
``data: <json>\\n\\n`` event per chunk and a last ``data: [DONE]\\n\\n``. A chunk has the shape of
the non-streamed response (``text``, ``output_ids``, ``meta_info``) with ``finish_reason`` null
until the last one, which carries what the non-streamed response carries (``e2e_latency`` among
it). By default the chunks are cumulative: the text, the ids and ``output_token_logprobs`` so far;
with SGLang's ``incremental_streaming_output`` each holds only what is new since the previous
chunk. A request of several prompts (or ``n > 1``) streams every sample's chunks interleaved, each
with its ``index`` in the batch. Chunks are sent after the first token and every
``stream_interval`` tokens (SGLang's server argument); one that finds the client behind sends
everything since the last it sent (the cumulative chunk is the latest state, the incremental one
the new tokens together), as SGLang's tokenizer manager does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from services.engine.scheduler import Sequence, version_spans

DONE = b"data: [DONE]\n\n"


def event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


class IncrementalText:
    """Text of a growing list of token ids, decoded a few tokens at a time.

    SGLang's detokenizer rule: decode from a few tokens before the new ones (so a word split over
    tokens decodes as the whole word does) and hold back text that ends in an incomplete UTF-8
    character (U+FFFD) until the next token completes it. Each call costs the new tokens, not the
    whole output.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.text = ""
        self._surrounding = 0
        self._read = 0

    def update(self, ids: list[int]) -> str:
        before = self._decode(ids[self._surrounding : self._read])
        after = self._decode(ids[self._surrounding :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._surrounding, self._read = self._read, len(ids)
        return self.text


class SampleStream:
    """One streamed sample: wakes on the scheduler's token notices and on its end, and turns
    the sequence's state into SGLang's chunks."""

    def __init__(
        self, seq: Sequence, decode: Callable[[list[int]], str], index: int | None, incremental: bool, interval: int
    ) -> None:
        self.seq = seq
        self.incremental = incremental
        self.index = index
        self._text = IncrementalText(decode)
        self._sent_tokens = 0
        self._sent_text = 0
        self._wake = asyncio.Event()
        seq.on_tokens, seq.stream_interval = self._wake.set, interval
        seq.future.add_done_callback(lambda _: self._wake.set())

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self.seq.future.done():
                yield self._last(self.seq.future.result())
                return
            chunk = self._running()
            if chunk is not None:
                yield chunk

    def _running(self) -> dict[str, Any] | None:
        seq = self.seq
        # The scheduler thread appends token versions last: their count is tokens complete in every list.
        count = len(seq.token_versions)
        if count <= self._sent_tokens:
            return None
        ids = seq.output_ids[:count]
        text = self._text.update(ids)
        meta: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": None,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": count,
            "cached_tokens": seq.cached_tokens,
            "weight_version": seq.token_versions[count - 1],
            "weight_versions": version_spans(seq.token_versions[:count], seq.token_versions[count - 1]),
        }
        if seq.return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(seq.logprobs[:count], ids, strict=True)]
        return self._shaped({"text": text, "output_ids": ids, "meta_info": meta}, count)

    def _last(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._shaped(dict(body, meta_info=dict(body["meta_info"])), len(body["output_ids"]))

    def _shaped(self, chunk: dict[str, Any], count: int) -> dict[str, Any]:
        """The chunk as sent: sliced to what is new when incremental; the batch index when batched."""
        if self.incremental:
            text = chunk["text"]
            chunk["text"] = text[self._sent_text :]
            chunk["output_ids"] = chunk["output_ids"][self._sent_tokens :]
            if "output_token_logprobs" in chunk["meta_info"]:
                chunk["meta_info"]["output_token_logprobs"] = chunk["meta_info"]["output_token_logprobs"][
                    self._sent_tokens :
                ]
            self._sent_text = len(text)
        self._sent_tokens = count
        if self.index is not None:
            chunk["index"] = self.index
        return chunk


async def sse_events(
    streams: list[SampleStream], on_finished: Callable[[dict[str, Any]], None]
) -> AsyncIterator[bytes]:
    """Every sample's chunks as server-sent events, interleaved as they come, then ``[DONE]``;
    ``on_finished`` sees each sample's last chunk."""
    pending: dict[asyncio.Task[dict[str, Any]], AsyncIterator[dict[str, Any]]] = {}
    for stream in streams:
        chunks = stream.chunks()
        pending[asyncio.ensure_future(anext(chunks))] = chunks
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                chunks = pending.pop(task)
                try:
                    chunk = task.result()
                except StopAsyncIteration:
                    continue
                if chunk["meta_info"]["finish_reason"] is not None:
                    on_finished(chunk)
                yield event(chunk)
                pending[asyncio.ensure_future(anext(chunks))] = chunks
        yield DONE
    finally:
        # A client that went away: the scheduler drops its samples as it drops a cancelled request's.
        for task in pending:
            task.cancel()
        for stream in streams:
            stream.seq.future.cancel()
