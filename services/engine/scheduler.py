"""The engine's scheduler: continuous batching on one thread that owns the model.

Each loop iteration (a *step*) it runs control commands (weight updates, pause, abort), then
admits waiting requests up to ``max_running_requests`` (prefilling each distinct prompt once),
samples one token for every running sequence, and feeds all of those tokens to the model in
**one** batched decode forward pass, queued on the device before the host reads the tokens back:
the device computes the next step's logits while the host streams this step's tokens and admits
the next requests. New requests therefore join between decode steps
instead of waiting for a running batch to drain. A step admits at most ``max_prefill_tokens``
prompt tokens to prefill, as SGLang's scheduler does: a wave of requests that arrived together
is taken over several steps, so its requests finish at different times instead of all at once.

Pause modes follow SGLang's ``/pause_generation``:

- ``abort``: every running and waiting request ends now with ``finish_reason.type ==
  "abort"`` and the tokens generated so far.
- ``retract``: running requests go back to the front of the waiting queue and drop their KV
  cache; after ``/continue_generation`` they are prefilled again (prompt + tokens so far) and
  continue where they stopped.
- ``in_place``: nothing moves; running requests keep their KV cache and continue on resume.

While paused (any mode) new requests wait; nothing is forwarded.

Per-token weight versions: a token is credited to the weights that computed the logits it was
sampled from. ``meta_info.weight_versions`` carries them as SGLang's spans
(``[{"version", "start", "end"}]``, output-token indices, end exclusive).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from relayrl.devices import upload
from services.engine.device import read_back
from services.engine.lora import LoraAdapter
from services.engine.model_runner import ModelRunner, OutOfBlocks, Slot
from services.engine.prefix_cache import CachedPrefix
from services.engine.sampling import SampleFn, SamplingConfig, sample_batch

log = logging.getLogger(__name__)

CLOSING_MESSAGE = "aborted: the engine is shutting down"

PauseMode = Literal["abort", "retract", "in_place"]

# A prompt as the prefill sees it: its token ids and the LoRA adapter it runs with.
PromptKey = tuple[tuple[int, ...], LoraAdapter | None]


@dataclass(eq=False)
class Sequence:
    """One sample being generated; resolved to SGLang's response dict when it finishes."""

    rid: str
    parent_rid: str
    prompt_ids: list[int]
    config: SamplingConfig
    return_logprob: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[dict[str, Any]]
    created_at: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[str] = field(default_factory=list)
    slot: Slot | None = None
    # The logits the next token is sampled from: a pass's ``[B, V]`` logits and this sequence's row
    # of them, so a step samples from the pass's own tensor instead of re-stacking a row per sequence.
    next_logits: tuple[torch.Tensor, int] | None = None
    logits_version: str = ""
    finish: dict[str, Any] | None = None
    # The LoRA adapter the request named (``lora_path``), held until it finishes; None: the base.
    lora_name: str | None = None
    adapter: LoraAdapter | None = None
    # Prompt tokens the prefix cache gave at admission, and the cache's epoch then.
    cached_tokens: int = 0
    cache_epoch: int = -1
    # A streamed request (``stream: true``): called on the sequence's event loop after its first
    # token and every ``stream_interval`` tokens after it (SGLang's rule), while it runs.
    on_tokens: Callable[[], None] | None = None
    stream_interval: int = 1

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


def version_spans(token_versions: list[str], current: str) -> list[dict[str, Any]]:
    """SGLang's ``weight_versions`` spans over output tokens; one span at ``current`` when there are none."""
    if not token_versions:
        return [{"version": current, "start": 0, "end": 0}]
    return extend_spans([], token_versions, 0, len(token_versions))


def extend_spans(spans: list[dict[str, Any]], token_versions: list[str], start: int, end: int) -> list[dict[str, Any]]:
    """``spans`` (those of the first ``start`` tokens) extended in place over tokens ``[start, end)``:
    a stream pays for its new tokens, not for all of them again at every chunk."""
    for index in range(start, end):
        version = token_versions[index]
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = index + 1
        else:
            spans.append({"version": version, "start": index, "end": index + 1})
    return spans


def stack_rows(rows: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """The ``[B, V]`` logits of ``rows`` (a pass's logits and a row of them each), in order: a view
    of one pass's logits where the rows run consecutively through it, as after a decode step, and
    one concatenation of such runs otherwise (newly prefilled rows, samples sharing a prompt's row)."""
    runs: list[torch.Tensor] = []
    start = 0
    while start < len(rows):
        tensor, first = rows[start]
        end = start + 1
        while end < len(rows) and rows[end][0] is tensor and rows[end][1] == first + end - start:
            end += 1
        runs.append(tensor[first : first + end - start])
        start = end
    return runs[0] if len(runs) == 1 else torch.cat(runs)


class Scheduler:
    def __init__(
        self,
        runner: ModelRunner,
        decode_text: Callable[[list[int]], str],
        eos_token_ids: set[int],
        max_running_requests: int,
        max_prefill_tokens: int,
        context_length: int,
        weight_version: str,
        seed: int,
        overlap: bool = True,
        sample: SampleFn = sample_batch,
        on_step: Callable[[Scheduler], None] = lambda _: None,
    ) -> None:
        self.runner = runner
        self.decode_text = decode_text
        self.eos_token_ids = eos_token_ids
        self.max_running = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.context_length = context_length
        self.weight_version = weight_version
        self.generator = torch.Generator(device=runner.device).manual_seed(seed)
        # Whether a step queues its decode pass before reading its tokens back (SGLang's overlap schedule).
        self.overlap = overlap
        self.sample = sample
        self.on_step = on_step
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.paused: PauseMode | None = None
        self.closing = False
        self.generated_tokens = 0
        # Seconds of the steps that had sequences to run, and of those the seconds spent waiting for
        # the device to hand back the step's tokens (after a real wait, until the GIL came back from
        # the serving thread too): the host's slack. Its work hides behind the passes, so on a GPU a
        # wait near none means the host bounds the engine; any more, the device.
        self.busy_s = 0.0
        self.device_wait_s = 0.0
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)

    # --- called from the event loop ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        self._thread.join(timeout=10)

    def submit(self, sequences: list[Sequence]) -> None:
        self._inbox.put(("generate", sequences))

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on the scheduler thread between two steps and returns its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._inbox.put(("command", (fn, loop, future)))
        return await future

    # --- scheduler thread ------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            idle = self.paused is not None or not (self.running or self.waiting)
            self._drain_inbox(block=idle)
            if self.paused is not None:
                continue
            try:
                started = time.perf_counter()
                self._admit()
                if self.running:
                    self._step()
                    self.busy_s += time.perf_counter() - started
            except Exception as exc:  # a broken batch fails its requests, never the engine
                log.exception("engine step failed")
                self.runner.kv.clear()
                for seq in [*self.running]:
                    self._finish(seq, {"type": "abort", "message": f"engine error: {exc}"})
            self.on_step(self)

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "generate":
            self.waiting.extend(payload)
            if self.closing:
                self.abort(abort_all=True, message=CLOSING_MESSAGE)
        elif kind == "command":
            fn, loop, future = payload
            try:
                result = fn()
            except Exception as exc:
                loop.call_soon_threadsafe(_set_exception, future, exc)
            else:
                loop.call_soon_threadsafe(_set_result, future, result)

    def _admit(self) -> None:
        # Each admitted sequence with its prompt key: its ids and adapter, built once per step.
        admitted: list[tuple[Sequence, PromptKey]] = []
        # Samples of one prompt (and adapter) are prefilled once, the others fork that row; each
        # distinct prompt costs the step its tokens the prefix cache does not give.
        matches: dict[PromptKey, tuple[CachedPrefix, int] | None] = {}
        tokens = 0
        # KV blocks this step's prompts may take: the free ones and those only the prefix cache holds.
        pool = self.runner.pool
        blocks, room = 0, pool.available() + self.runner.prefixes.nbytes // pool.block_bytes
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            seq = self.waiting[0]
            if seq.future.cancelled():
                self.waiting.popleft()
                self.runner.lora.release(seq.adapter)
                continue
            if seq.config.max_new_tokens <= len(seq.output_ids):
                self.waiting.popleft()
                self._finish(seq, {"type": "length", "length": seq.config.max_new_tokens})
                continue
            key = (tuple(seq.all_ids), seq.adapter)
            if key not in matches:
                match = self.runner.prefixes.lookup(key[0], seq.adapter)
                cost = len(key[0]) - (match[1] if match else 0)
                needed = -(-cost // pool.block_size) + 1
                if matches and (tokens + cost > self.max_prefill_tokens or blocks + needed > room):
                    break  # the next step admits it; one step always admits at least one prompt
                matches[key] = match
                tokens += cost
                blocks += needed
            admitted.append((self.waiting.popleft(), key))
        if not admitted:
            return
        distinct = list(matches)
        try:
            outputs = self.runner.prefill(
                [ids for ids, _ in distinct], [adapter for _, adapter in distinct], [matches[key] for key in distinct]
            )
        except OutOfBlocks as exc:
            self._requeue([seq for seq, _ in admitted], exc)
            return
        prefilled = dict(zip(distinct, outputs, strict=True))
        placed: set[PromptKey] = set()
        for seq, key in admitted:
            first = prefilled[key]
            seq.slot = self.runner.kv.fork(first.slot) if key in placed else first.slot
            placed.add(key)
            seq.next_logits, seq.cached_tokens = (first.batch_logits, first.row), first.cached_tokens
            seq.cache_epoch = self.runner.prefixes.epoch
            seq.logits_version = self.weight_version
            self.running.append(seq)

    def _requeue(self, admitted: list[Sequence], exc: OutOfBlocks) -> None:
        """Admitted sequences the KV cache had no room for wait at the front for running ones to
        finish; with none running they never fit, and the first is refused."""
        self.waiting.extendleft(reversed(admitted))
        if not self.running:
            seq = self.waiting.popleft()
            self._finish(seq, {"type": "abort", "message": f"the prompt does not fit the KV cache: {exc}"})

    def _retract(self, seq: Sequence) -> None:
        """Sends a running sequence back to the front of the queue (its KV blocks freed), as SGLang
        retracts when its KV cache is full; it is prefilled again when there is room."""
        self._drop_cache(seq)
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def _step(self) -> None:
        """One token for every running sequence: sample it, queue the next decode pass on the
        sampled tokens where they lie, and only then wait for them on the host, so that the device
        runs that pass while the host streams this step's tokens and admits the next requests (the
        overlap of SGLang's scheduler). A sequence that samples its stop token is known only after
        the wait: its row of that pass is computed and thrown away, as SGLang's is. Without the
        overlap (``disable_overlap_schedule``) the tokens come back first and only the sequences
        that go on are fed."""
        sampled = list(self.running)
        logits_BV = stack_rows([seq.next_logits for seq in sampled])  # type: ignore[misc]
        tokens_B, logprobs_B = self.sample(logits_BV, [seq.config for seq in sampled], self.generator)
        # Token ids survive the float64 round trip: one copy to the host for both.
        picks = read_back(torch.stack([tokens_B.double(), logprobs_B.double()], dim=1))
        # Each token is credited to the weights of the logits it was drawn from, before the pass
        # queued next relabels the sequence's logits with the weights now held.
        versions = [seq.logits_version for seq in sampled]
        retracted: list[Sequence] = []
        if self.overlap:
            rows = [i for i, seq in enumerate(sampled) if not seq.future.cancelled() and not self._full_after(seq)]
            fed = tokens_B
            if len(rows) < len(sampled):
                fed = tokens_B[upload(torch.tensor(rows, dtype=torch.long), tokens_B.device)]
            retracted = self._decode([sampled[i] for i in rows], fed)
        waited = time.perf_counter()
        picked = picks()
        self.device_wait_s += time.perf_counter() - waited
        self._take_tokens(sampled, picked, versions, retracted)
        if not self.overlap:
            for seq in [seq for seq in self.running if seq.future.cancelled()]:
                self._finish(seq, {"type": "abort", "message": "client disconnected"})
            self._decode(list(self.running), [seq.output_ids[-1] for seq in self.running])

    def _decode(self, live: list[Sequence], fed: torch.Tensor | list[int]) -> list[Sequence]:
        """Queues the decode pass that feeds ``fed[i]`` to ``live[i]``; returns the sequences retracted
        for want of KV blocks (the most recently admitted first; they wait to be prefilled again)."""
        retracted: list[Sequence] = []
        while live:
            try:
                logits = self.runner.decode([s.slot for s in live], fed, [s.adapter for s in live])
                break
            except OutOfBlocks:
                retracted.append(live[-1])
                self._retract(live[-1])
                live, fed = live[:-1], fed[:-1]
        else:
            return retracted
        for row, seq in enumerate(live):
            seq.next_logits, seq.logits_version = (logits, row), self.weight_version
        return retracted

    def _full_after(self, seq: Sequence) -> bool:
        """Whether the token being sampled is ``seq``'s last by length (so it needs no next pass)."""
        produced = len(seq.output_ids) + 1
        return produced >= seq.config.max_new_tokens or len(seq.prompt_ids) + produced >= self.context_length

    def _take_tokens(
        self, sampled: list[Sequence], rows: list[list[float]], versions: list[str], retracted: list[Sequence]
    ) -> None:
        """Appends each sampled token (with its log-prob and weight version) to its sequence, finishes
        those that end with it, and tells streams once per event loop (one wake-up of the loop, not
        one per sequence)."""
        streamed: dict[asyncio.AbstractEventLoop, list[Callable[[], None]]] = {}
        for seq, (token_f, logprob), version in zip(sampled, rows, versions, strict=True):
            token = int(token_f)
            if seq.first_token_at is None:
                seq.first_token_at = time.monotonic()
            seq.output_ids.append(token)
            seq.logprobs.append(logprob)
            seq.token_versions.append(version)
            self.generated_tokens += 1
            reason = self._finish_reason(seq, token)
            if reason is None and seq.future.cancelled():
                reason = {"type": "abort", "message": "client disconnected"}
            if reason is not None:
                if seq in retracted:
                    self.waiting.remove(seq)
                self._finish(seq, reason)
            elif seq.on_tokens is not None and (len(seq.output_ids) - 1) % seq.stream_interval == 0:
                streamed.setdefault(seq.loop, []).append(seq.on_tokens)
        for loop, callbacks in streamed.items():
            loop.call_soon_threadsafe(_call_each, callbacks)

    def _finish_reason(self, seq: Sequence, token: int) -> dict[str, Any] | None:
        if (token in self.eos_token_ids and not seq.config.ignore_eos) or token in seq.config.stop_token_ids:
            return {"type": "stop", "matched": token}
        if len(seq.output_ids) >= seq.config.max_new_tokens:
            return {"type": "length", "length": seq.config.max_new_tokens}
        if len(seq.prompt_ids) + len(seq.output_ids) >= self.context_length:
            return {"type": "length", "length": len(seq.output_ids)}
        return None

    def _finish(self, seq: Sequence, reason: dict[str, Any]) -> None:
        seq.finish = reason
        if seq.slot is not None and seq.cache_epoch == self.runner.prefixes.epoch:
            # For the next turn of the conversation; a row kept across a weight change mixes versions.
            self.runner.remember(seq.slot, seq.all_ids[: seq.slot.length], seq.adapter)
        self._drop_cache(seq)
        self.runner.lora.release(seq.adapter)
        seq.adapter = None
        if seq in self.running:
            self.running.remove(seq)
        meta: dict[str, Any] = {
            "id": seq.rid,
            "finish_reason": reason,
            "prompt_tokens": len(seq.prompt_ids),
            "completion_tokens": len(seq.output_ids),
            "cached_tokens": seq.cached_tokens,
            "weight_version": seq.token_versions[-1] if seq.token_versions else self.weight_version,
            "weight_versions": version_spans(seq.token_versions, self.weight_version),
            "e2e_latency": time.monotonic() - seq.created_at,
        }
        if seq.first_token_at is not None:
            # Not an SGLang field: the engine bench's time to first token (arrival to first sampled token).
            meta["first_token_latency"] = seq.first_token_at - seq.created_at
        if seq.return_logprob:
            rows = zip(seq.logprobs, seq.output_ids, strict=True)
            meta["output_token_logprobs"] = [[logprob, token, None] for logprob, token in rows]
        body = {"text": self.decode_text(seq.output_ids), "output_ids": list(seq.output_ids), "meta_info": meta}
        seq.loop.call_soon_threadsafe(_set_result, seq.future, body)

    def _drop_cache(self, seq: Sequence) -> None:
        if seq.slot is not None:
            self.runner.kv.release(seq.slot)
        seq.slot = seq.next_logits = None

    # --- commands (run on the scheduler thread through ``call``) -------------------------

    def pause(self, mode: PauseMode) -> None:
        if mode == "abort":
            self.abort(abort_all=True, message="aborted by pause_generation(mode=abort)")
        elif mode == "retract":
            for seq in reversed(self.running):
                self._drop_cache(seq)
                self.waiting.appendleft(seq)
            self.running.clear()
        self.paused = mode

    def resume(self) -> None:
        self.paused = None

    def close(self) -> None:
        """Ends every request, now and from here on: a request held by a pause (or queued behind a
        full batch) would otherwise keep the HTTP server's graceful shutdown waiting for ever."""
        self.closing = True
        self.abort(abort_all=True, message=CLOSING_MESSAGE)

    def abort(self, rid: str = "", abort_all: bool = False, message: str = "aborted by abort_request") -> int:
        victims = [
            seq for seq in [*self.running, *self.waiting] if abort_all or seq.rid == rid or seq.parent_rid == rid
        ]
        for seq in victims:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self._finish(seq, {"type": "abort", "message": message})
        return len(victims)

    def set_weight_version(self, version: str) -> None:
        self.weight_version = version


def _call_each(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


def _set_result(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
