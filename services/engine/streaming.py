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
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from services.engine.scheduler import Sequence, extend_spans

DONE = b"data: [DONE]\n\n"


def event(chunk: dict[str, Any]) -> bytes:
    # orjson, as SGLang's server: a tenth of json.dumps's time, paid per stream and token.
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


class IncrementalText:
    """Text of a growing list of token ids, decoded a few tokens at a time.

    SGLang's detokenizer rule: decode from a few tokens before the new ones (so a word split over
    tokens decodes as the whole word does) and hold back text that ends in an incomplete UTF-8
    character (U+FFFD) until the next token completes it. Each call costs the new tokens, not the
    whole output.

    The window moves on only when text comes out, so tokens that decode to nothing make it grow.
    With ``known`` (where ``decode`` itself drops ids from ``known`` on, as the Rust tokenizer does)
    those ids are left out before decoding: a model whose output rows outnumber its tokenizer's ids
    (Qwen's padded vocabulary; the random ``base`` preset, 151,936 rows over a 259-id tokenizer, where
    nearly every sampled id is past them) would otherwise decode every token since the last visible
    one at each chunk, about 19 us a token over a 562-token answer on the CPU machine.
    """

    def __init__(self, decode: Callable[[list[int]], str], known: int | None = None) -> None:
        self._decode = decode
        self._known = known
        # The caller's ids taken so far, and those of them the tokenizer knows.
        self._taken = 0
        self._ids: list[int] = []
        self.text = ""
        self._surrounding = 0
        self._read = 0

    def update(self, ids: list[int], count: int) -> str:
        """The text of ``ids[:count]`` (``ids`` may already hold more: the scheduler appends as it goes)."""
        new = ids[self._taken : count]
        self._taken = count
        kept = len(self._ids)
        self._ids.extend(new if self._known is None else [i for i in new if i < self._known])
        if len(self._ids) == kept:
            return self.text
        before = self._decode(self._ids[self._surrounding : self._read])
        after = self._decode(self._ids[self._surrounding :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self._surrounding, self._read = self._read, len(self._ids)
        return self.text


@dataclass(frozen=True, slots=True)
class TextDecoder:
    """Token ids to the engine's text: ``decode`` for a whole output, :meth:`stream` for one that grows.
    ``known``: where ``decode`` drops the ids the tokenizer does not have, one past its largest id
    (:func:`services.engine.state.text_decoder`)."""

    decode: Callable[[list[int]], str]
    known: int | None = None

    def stream(self) -> IncrementalText:
        return IncrementalText(self.decode, self.known)


class SampleStream:
    """One streamed sample: wakes on the scheduler's token notices and on its end, and turns
    the sequence's state into SGLang's chunks."""

    def __init__(self, seq: Sequence, text: TextDecoder, index: int | None, incremental: bool, interval: int) -> None:
        self.seq = seq
        self.incremental = incremental
        self.index = index
        self._text = text.stream()
        self._sent_tokens = 0
        self._sent_text = 0
        # The weight-version spans of the first ``_spanned`` tokens.
        self._spans: list[dict[str, Any]] = []
        self._spanned = 0
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
        """The chunk of the tokens so far, built from those not yet sent: what a chunk costs does not
        grow with the tokens before it (hundreds of streams a step, each a thousand tokens long)."""
        seq = self.seq
        # The scheduler thread appends token versions last: their count is tokens complete in every list.
        count = len(seq.token_versions)
        if count <= self._sent_tokens:
            return None
        extend_spans(self._spans, seq.token_versions, self._spanned, count)
        self._spanned = count
        meta: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": None,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": count,
            "cached_tokens": seq.cached_tokens,
            "weight_version": seq.token_versions[count - 1],
            # Copies: the last span grows with the next tokens, after this chunk is handed on.
            "weight_versions": [dict(span) for span in self._spans],
        }
        first = self._sent_tokens if self.incremental else 0
        ids = seq.output_ids[first:count]
        if seq.return_logprob:
            rows = zip(seq.logprobs[first:count], ids, strict=True)
            meta["output_token_logprobs"] = [[logprob, token, None] for logprob, token in rows]
        return self._shaped(self._text.update(seq.output_ids, count), ids, meta, count)

    def _last(self, body: dict[str, Any]) -> dict[str, Any]:
        meta, first = dict(body["meta_info"]), self._sent_tokens if self.incremental else 0
        if "output_token_logprobs" in meta:
            meta["output_token_logprobs"] = meta["output_token_logprobs"][first:]
        return self._shaped(body["text"], body["output_ids"][first:], meta, len(body["output_ids"]))

    def _shaped(self, text: str, ids: list[int], meta: dict[str, Any], count: int) -> dict[str, Any]:
        """The chunk as sent, from the whole text so far and the ids (and log-probs) it carries: those
        since the last chunk when incremental, all of them otherwise; the batch index when batched."""
        chunk = {"text": text[self._sent_text :] if self.incremental else text, "output_ids": ids, "meta_info": meta}
        self._sent_text, self._sent_tokens = len(text), count
        if self.index is not None:
            chunk["index"] = self.index
        return chunk


async def sse_events(
    streams: list[SampleStream], on_finished: Callable[[dict[str, Any]], None]
) -> AsyncIterator[bytes]:
    """Every sample's chunks as server-sent events, interleaved as they come, then ``[DONE]``;
    ``on_finished`` sees each sample's last chunk."""
    # One sample (most requests) is read in place: no task and no wait per chunk, which with
    # hundreds of streams a step the serving thread would pay for every token.
    chunks = streams[0].chunks() if len(streams) == 1 else _interleaved(streams)
    try:
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if chunk["meta_info"]["finish_reason"] is not None:
                    on_finished(chunk)
                yield event(chunk)
        yield DONE
    finally:
        # A client that went away: the scheduler drops its samples as it drops a cancelled request's.
        for stream in streams:
            stream.seq.future.cancel()


async def _interleaved(streams: list[SampleStream]) -> AsyncIterator[dict[str, Any]]:
    """Several samples' chunks in the order they come: a task waits for each sample's next chunk."""
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
                yield chunk
                pending[asyncio.ensure_future(anext(chunks))] = chunks
    finally:
        for task in pending:
            task.cancel()
