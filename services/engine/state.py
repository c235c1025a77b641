"""Everything one engine process holds: the model, its tokenizer, the scheduler, metrics."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relayrl.config import SettingsError
from relayrl.metrics import ServiceMetrics
from relayrl.models.loading import load_causal_lm, load_tokenizer
from relayrl.profiling import compile_summary
from services.engine.attention import backend_named, query_group
from services.engine.config import EngineSettings
from services.engine.device import CudaGraphDecode, decode_runner, kv_pool_for
from services.engine.kv_pool import KVLayout
from services.engine.lora import LoraSet
from services.engine.model_runner import ModelRunner
from services.engine.profiler import EngineProfiler
from services.engine.sampling import sampler_named
from services.engine.scheduler import PauseMode, Scheduler
from services.engine.streaming import TextDecoder
from services.engine.tensor_updates import named_tensors
from services.engine.weights import apply_tensors, read_safetensors_dir, read_safetensors_to_device
from services.paramsync.channels.torch_dist import TorchDistReceiver

log = logging.getLogger(__name__)


def text_decoder(tokenizer: Any) -> TextDecoder:
    """``tokenizer.decode(ids, skip_special_tokens=True)``, through the Rust tokenizer itself where
    that is all transformers' decode would do (a fast tokenizer whose class keeps transformers'
    decode, with no clean-up of spaces): the wrapper converts every id in Python first, which with
    hundreds of streams a step took a third of the thread that serves them. The Rust tokenizer drops
    ids it does not have, so its streams may leave them out (:class:`~services.engine.streaming.IncrementalText`)."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    cls = type(tokenizer)
    if (
        isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
    ):
        rust = tokenizer.backend_tokenizer
        known = max(rust.get_vocab(with_added_tokens=True).values()) + 1
        return TextDecoder(functools.partial(rust.decode, skip_special_tokens=True), known)
    return TextDecoder(functools.partial(tokenizer.decode, skip_special_tokens=True))


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = ServiceMetrics("engine")
        m = self.registry
        self.forward_passes = m.counter("forward_passes", "Model forward passes, by kind.", "total", ["kind"])
        self.generated_tokens = m.counter("generated_tokens", "Tokens sampled.", "total")
        self.prompt_tokens = m.counter(
            "prompt_tokens",
            "Prompt tokens taken in, by source: prefilled (fed to the model) or cached (keys and values from the"
            " prefix cache).",
            "total",
            ["source"],
        )
        self.finished_requests = m.counter(
            "finished_requests", "Samples finished, by finish reason.", "total", ["reason"]
        )
        self.running = m.gauge("running_requests", "Sequences in the running batch.")
        self.waiting = m.gauge("waiting_requests", "Sequences waiting for a batch slot.")
        self.weight_updates = m.counter("weight_updates", "Successful weight updates.", "total")
        self.weight_update_failures = m.counter("weight_update_failures", "Refused or failed weight updates.", "total")
        self.weight_version = m.gauge("weight_version", "Weight version served (when it is an integer).")
        self.generation_paused = m.histogram(
            "generation_paused",
            "Seconds the scheduler took no step for one pause: pause_generation to continue_generation, or one"
            " weight update sent without a pause (its abort, receive and copy).",
        )
        self.lora_requests = m.counter(
            "lora_requests", "Samples admitted with a LoRA adapter (lora_path on /generate).", "total"
        )


@dataclass
class _Seen:
    prefill: int = 0
    decode: int = 0
    tokens: int = 0
    prefilled: int = 0
    cached: int = 0


def runner_or_fallback(built: Callable[[str], ModelRunner], settings: EngineSettings) -> ModelRunner:
    """The runner over the settings' attention backend; where its kernels fail to build at start
    (``torch.compile`` or Triton on the host's own torch), the one over ``torch_native`` if the
    backend was auto's choice, and one line naming the setting if the user's.

    The engine runs on whatever torch the GPU host brings, and a compiler bug of one version must
    not stop a rollout that the plain path would serve (slower, and ``/get_model_info`` says which).
    """
    attention = settings.resolved_attention_backend()
    try:
        return built(attention)
    except (SettingsError, torch.OutOfMemoryError):
        raise
    except Exception as exc:  # torch.compile, inductor and Triton raise their own kinds
        if settings.attention_backend != "auto" or attention == "torch_native":
            raise SettingsError(
                "EngineSettings",
                [f"RELAYRL_ENGINE_ATTENTION_BACKEND={attention}: its kernels failed to build at start ({exc})"],
            ) from exc
        log.exception("the %s attention backend failed to build at start; serving with torch_native", attention)
        return built("torch_native")


class EngineState:
    def __init__(self, settings: EngineSettings) -> None:
        torch.set_num_threads(settings.resolved_torch_threads())
        self.settings = settings
        self.device = torch.device(settings.device)
        if settings.shared_weights_dir and not settings.resolved_shared_weights_dir():
            log.warning(
                "shared_weights_dir is ignored on %s: every weight update is copied to the GPU", settings.device
            )
        sampler = sampler_named(settings.resolved_sampling_backend(), self.device)
        self.model = load_causal_lm(settings.model_path, dtype=settings.resolved_dtype(), device=settings.device)
        self.tokenizer = load_tokenizer(settings.model_path)
        self.text = text_decoder(self.tokenizer)
        config = self.model.config
        self.vocab_size = int(config.vocab_size)
        self.context_length = settings.context_length or int(getattr(config, "max_position_embeddings", 4096))
        eos = config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.metrics = EngineMetrics()
        self._seen = _Seen()
        self.receiver = TorchDistReceiver()
        self.lora = LoraSet(self.model)
        self.runner = self._runner(settings)
        self.sampling_backend = sampler.name
        sampler.warm_up(self.vocab_size, self.model.dtype, self.device)
        self.scheduler = Scheduler(
            runner=self.runner,
            decode_text=self.text.decode,
            eos_token_ids=eos_ids,
            max_running_requests=settings.max_running_requests,
            max_prefill_tokens=settings.max_prefill_tokens,
            context_length=self.context_length,
            weight_version=settings.weight_version,
            seed=settings.seed,
            overlap=not settings.disable_overlap_schedule,
            sample=sampler.sample,
            on_step=self._observe,
        )
        self.profiler = EngineProfiler(self.device, settings.torch_profiler_dir)
        self._set_version_gauge(settings.weight_version)
        # When the scheduler was paused by pause_generation (None while it runs).
        self._paused_at: float | None = None

    def _runner(self, settings: EngineSettings) -> ModelRunner:
        """The model runner on the settings' device: its KV pool, attention backend and decode runner."""
        page = settings.resolved_page_size()
        cache_bytes = settings.prefix_cache_mb << 20
        cache_tokens = cache_bytes // KVLayout.of(self.model).bytes_per_token
        pool = kv_pool_for(
            self.model,
            block_size=page,
            context_length=self.context_length,
            max_total_tokens=settings.max_total_tokens,
            # Today's CPU limits: every running sequence at full context, and the prefix cache's budget.
            cpu_tokens=settings.max_running_requests * self.context_length + cache_tokens,
            mem_fraction_static=settings.mem_fraction_static,
        )
        decoder = decode_runner(
            self.device,
            settings.disable_cuda_graph,
            settings.resolved_cuda_graph_max_bs(),
            -(-self.context_length // page),
        )

        def built(attention: str) -> ModelRunner:
            backend = backend_named(
                attention, self.device, query_group(self.model), settings.triton_attention_num_kv_splits
            )
            runner = ModelRunner(
                self.model,
                pool=pool,
                lora=self.lora,
                prefix_cache_bytes=cache_bytes,
                attention=backend,
                decoder=decoder,
            )
            if runner.attention.compiles:
                started = time.perf_counter()
                passes = runner.warm_up(self.context_length)
                log.info("warmed up %d pass shapes in %.1f s", passes, time.perf_counter() - started)
            return runner

        runner = runner_or_fallback(built, settings)
        if isinstance(decoder, CudaGraphDecode):
            decoder.capture_all(runner)
        return runner

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def read_checkpoint(self, model_path: str) -> dict[str, torch.Tensor]:
        """A version's tensors, read beside generation: mapped on CPU, one host-to-device copy per file on CUDA."""
        if self.device.type == "cuda":
            return read_safetensors_to_device(model_path, self.device)
        return read_safetensors_dir(model_path)

    def open_shared_tensors(self, serialized: list[str], load_format: str | None) -> dict[str, torch.Tensor]:
        """SGLang's ``update_weights_from_tensor`` payload, its handles (CUDA IPC or shared memory) opened
        beside generation."""
        return named_tensors(serialized, load_format)

    def serves_in_place(self, model_path: str) -> bool:
        """Whether a version read from ``model_path`` is served from its file (``shared_weights_dir``)."""
        root = self.settings.resolved_shared_weights_dir()
        return bool(root) and Path(model_path).resolve().is_relative_to(Path(root).resolve())

    def pause(self, mode: PauseMode) -> None:
        """SGLang's ``/pause_generation`` (on the scheduler thread); timed until its continue."""
        if self.scheduler.paused is None:
            self._paused_at = time.perf_counter()
        self.scheduler.pause(mode)

    def resume(self) -> None:
        """SGLang's ``/continue_generation`` (on the scheduler thread)."""
        if self._paused_at is not None:
            self.metrics.generation_paused.observe(time.perf_counter() - self._paused_at)
        self._paused_at = None
        self.scheduler.resume()

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Times a weight update run on the scheduler thread while not paused: no step runs
        meanwhile. Under a pause, the pause's own time (to its continue) already holds it."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self.scheduler.paused is None:
                self.metrics.generation_paused.observe(time.perf_counter() - started)

    def apply(
        self, tensors: Mapping[str, torch.Tensor], version: str | None, abort_all: bool, in_place: bool = False
    ) -> None:
        """Installs new weights (served from ``tensors`` themselves with ``in_place``: see
        :func:`~services.engine.weights.apply_tensors`); runs on the scheduler thread, between two
        forward passes."""
        with self._holding():
            self._install(tensors, version, abort_all, in_place)

    def receive_and_apply(
        self,
        group: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: str | None,
        abort_all: bool,
    ) -> None:
        """Receives a broadcast version and installs it, on the scheduler thread: no step runs meanwhile."""
        with self._holding():
            self._install(self.receiver.receive(group, names, dtypes, shapes), version, abort_all)

    def _install(
        self, tensors: Mapping[str, torch.Tensor], version: str | None, abort_all: bool, in_place: bool = False
    ) -> None:
        if abort_all:
            self.scheduler.abort(abort_all=True, message="aborted for a weight update")
        apply_tensors(self.model, tensors, in_place)
        # Keys and values the old weights computed answer no prompt of the new ones.
        self.scheduler.runner.prefixes.clear()
        if version is not None:
            self.scheduler.set_weight_version(version)
            self._set_version_gauge(version)
        self.metrics.weight_updates.inc()

    def set_weight_version(self, version: str, abort_all: bool) -> None:
        """SGLang's ``/update_weight_version``: the version a LoRA switch reports (on the scheduler thread)."""
        if abort_all:
            self.scheduler.abort(abort_all=True, message="aborted for a weight version update")
        self.scheduler.set_weight_version(version)
        self._set_version_gauge(version)

    def _set_version_gauge(self, version: str) -> None:
        if version.lstrip("-").isdigit():
            self.metrics.weight_version.set(int(version))

    def _observe(self, scheduler: Scheduler) -> None:
        counts = scheduler.runner.counts
        self.metrics.forward_passes.labels("prefill").inc(counts.prefill - self._seen.prefill)
        self.metrics.forward_passes.labels("decode").inc(counts.decode - self._seen.decode)
        self.metrics.generated_tokens.inc(scheduler.generated_tokens - self._seen.tokens)
        self.metrics.prompt_tokens.labels("prefilled").inc(counts.prefill_tokens - self._seen.prefilled)
        self.metrics.prompt_tokens.labels("cached").inc(counts.cached_tokens - self._seen.cached)
        self._seen = _Seen(
            counts.prefill, counts.decode, scheduler.generated_tokens, counts.prefill_tokens, counts.cached_tokens
        )
        self.metrics.running.set(len(scheduler.running))
        self.metrics.waiting.set(len(scheduler.waiting))
        self.profiler.observe(counts.total)

    def record_finished(self, results: list[dict[str, Any]]) -> None:
        for body in results:
            self.metrics.finished_requests.labels(body["meta_info"]["finish_reason"]["type"]).inc()

    def model_info(self) -> dict[str, Any]:
        """SGLang's ``/get_model_info`` fields plus the CPU engine's batching counters."""
        counts = self.scheduler.runner.counts
        decoder = self.runner.decoder
        compiled = compile_summary()
        return {
            "model_path": self.settings.model_path,
            "tokenizer_path": self.settings.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.scheduler.weight_version,
            "context_length": self.context_length,
            "num_forward_passes": counts.total,
            "num_prefill_forward_passes": counts.prefill,
            "num_decode_forward_passes": counts.decode,
            "max_decode_batch_size": counts.max_decode_batch,
            "generated_tokens": self.scheduler.generated_tokens,
            "busy_seconds": self.scheduler.busy_s,
            "device_wait_seconds": self.scheduler.device_wait_s,
            "overlap_schedule": self.scheduler.overlap,
            "prefill_tokens": counts.prefill_tokens,
            "cached_prompt_tokens": counts.cached_tokens,
            "device": str(self.device),
            "attention_backend": self.runner.attention.name,
            "sampling_backend": self.sampling_backend,
            "kv_block_size": self.runner.pool.block_size,
            "kv_total_blocks": self.runner.pool.max_blocks - 1,
            "kv_used_blocks": self.runner.pool.used_blocks,
            "kv_peak_used_blocks": self.runner.pool.peak_used,
            "cuda_graph_batch_sizes": sorted(decoder.graphs) if isinstance(decoder, CudaGraphDecode) else [],
            "cuda_graph_replays": decoder.replays if isinstance(decoder, CudaGraphDecode) else 0,
            # torch.compile's graphs and seconds in this process: a count that grows while serving means
            # requests waited on a compilation that the start-up warm-up did not do.
            "compiled_graphs": compiled["graphs"],
            "compile_seconds": compiled["seconds"],
            "peak_device_memory_bytes": (
                torch.cuda.max_memory_reserved(self.device) if self.device.type == "cuda" else None
            ),
            "num_running_requests": len(self.scheduler.running),
            "num_waiting_requests": len(self.scheduler.waiting),
            "paused": self.scheduler.paused,
            "loaded_lora_adapters": self.lora.loaded(),
        }
