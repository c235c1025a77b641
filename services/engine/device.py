"""The engine's device-specific parts behind one small interface: how a step's tokens come back to
the host, how a decode step runs, and how much memory the KV cache gets (host data goes up through
:func:`relayrl.devices.upload`, which the trainer shares).

A :class:`DecodeRunner` runs one decode forward pass for the :class:`~services.engine.model_runner.ModelRunner`.
On CPU (and on CUDA with ``disable_cuda_graph``) :class:`EagerDecode` simply calls the model. On
CUDA :class:`CudaGraphDecode` replays a graph captured at the smallest captured batch size that
fits: the step's inputs are copied into static tensors, padding rows read and write only the
pool's scratch block, and the first rows of the static logits are the answer. The whole pass,
the flex_attention block mask's construction included, is inside the graph, so a replay costs
one launch. Graphs need fixed addresses: the pool is allocated once on CUDA, and weight updates
copy into the parameters instead of replacing them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from relayrl.config import SettingsError
from services.engine.attention import AttentionBackend, PassInputs
from services.engine.kv_pool import BlockPool, KVLayout

log = logging.getLogger(__name__)


class ModelRunner(Protocol):
    """What a decode runner uses of :class:`~services.engine.model_runner.ModelRunner` (a protocol,
    so that this module, which the model runner imports, does not import it back)."""

    device: torch.device
    attention: AttentionBackend
    pool: BlockPool

    def forward_logits(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs) -> torch.Tensor: ...


class DecodeRunner(Protocol):
    def run(
        self, runner: ModelRunner, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs
    ) -> torch.Tensor:
        """Last-column logits ``[B, V]`` of one decode pass (``input_ids`` and ``positions`` are ``[B, 1]``)."""
        ...


def read_back(tensor: torch.Tensor) -> Callable[[], list[Any]]:
    """Starts copying ``tensor`` to the host behind the work queued before it, and returns a function
    that waits for the copy and gives it as a list. Work queued in between (the next pass) runs on
    the device while the host waits, and after. On CPU the copy is made at once."""
    if tensor.device.type != "cuda":
        values = tensor.tolist()
        return lambda: values
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def wait() -> list[Any]:
        # A copy already done costs no wait: synchronising would hand the GIL to the serving thread
        # and count the time until it came back as the device's.
        if not copied.query():
            copied.synchronize()
        return host.tolist()

    return wait


class EagerDecode:
    def run(
        self, runner: ModelRunner, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs
    ) -> torch.Tensor:
        return runner.forward_logits(input_ids, positions, inputs)


def graph_batch_sizes(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to ``max_bs`` (and ``max_bs`` itself)."""
    sizes = [size for size in (1, 2, 4, 8) if size <= max_bs]
    sizes += list(range(16, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


@dataclass
class _Static:
    input_ids: torch.Tensor
    positions: torch.Tensor
    write_index: torch.Tensor
    tables: torch.Tensor
    lengths: torch.Tensor


class CudaGraphDecode:
    """Decode steps replayed from CUDA graphs captured at :func:`graph_batch_sizes` (see the module docstring).

    Only a backend whose decode plan keeps its shapes is captured (``graphable``: flex_attention,
    triton; the torch_native gather's width changes every step); a larger batch, or any other
    backend, decodes eagerly.
    """

    def __init__(self, max_bs: int, max_blocks_per_seq: int) -> None:
        self.sizes = graph_batch_sizes(max_bs)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._static: _Static | None = None
        self._pool: object | None = None
        self.replays = 0
        # Set when capture failed at start: every step then decodes eagerly (logged once, not fatal).
        self.disabled = False

    def run(
        self, runner: ModelRunner, input_ids: torch.Tensor, positions: torch.Tensor, inputs: PassInputs
    ) -> torch.Tensor:
        batch = input_ids.shape[0]
        size = next((s for s in self.sizes if s >= batch), None)
        if size is None or self.disabled or not runner.attention.graphable:
            return runner.forward_logits(input_ids, positions, inputs)
        static = self._static or self._allocate(runner)
        width = inputs.tables_BN.shape[1]
        static.input_ids[:batch].copy_(input_ids)
        static.positions[:batch].copy_(positions)
        static.write_index[:batch].copy_(inputs.write_index_BL)
        static.tables[:batch].zero_()
        static.tables[:batch, :width].copy_(inputs.tables_BN)
        static.lengths[:batch].copy_(inputs.lengths_B)
        # Padding rows: no tokens, position 0, writing to the scratch block.
        for tensor in (static.input_ids, static.positions, static.write_index, static.tables, static.lengths):
            tensor[batch:size].zero_()
        graph, logits = self.graphs.get(size) or self._capture(runner, size)
        graph.replay()
        self.replays += 1
        return logits[:batch].clone()

    @torch.inference_mode()
    def capture_all(self, runner: ModelRunner) -> None:
        """Captures every batch size now (at start), largest first so smaller graphs reuse its memory.
        Under inference mode, as decode runs: a kernel compiled under another grad mode would be
        compiled again at the first request.

        A capture that fails (an operation CUDA graphs cannot hold, in some torch or transformers
        version) leaves the engine serving eagerly rather than not at all; the log says why.
        """
        if not runner.attention.graphable:
            log.info("decode runs eagerly: CUDA graphs cannot hold the %s backend's steps", runner.attention.name)
            return
        try:
            for size in reversed(self.sizes):
                if size not in self.graphs:
                    self._capture(runner, size)
        except RuntimeError:
            log.exception("capturing decode CUDA graphs failed; decoding eagerly")
            self.disabled, self.graphs = True, {}
            torch.cuda.synchronize()
            return
        log.info("captured decode CUDA graphs at batch sizes %s", self.sizes)

    def _allocate(self, runner: ModelRunner) -> _Static:
        device, largest = runner.device, self.sizes[-1]

        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        columns = self.max_blocks_per_seq
        self._static = _Static(
            zeros(largest, 1), zeros(largest, 1), zeros(largest, 1), zeros(largest, columns), zeros(largest)
        )
        return self._static

    def _capture(self, runner: ModelRunner, size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        static = self._static or self._allocate(runner)
        # The longest row the static tables can describe: the plans graphs hold do not read it.
        longest = static.tables.shape[1] * runner.pool.block_size
        inputs = PassInputs(
            static.write_index[:size], static.tables[:size], static.positions[:size], static.lengths[:size], longest
        )

        def forward() -> torch.Tensor:
            return runner.forward_logits(static.input_ids[:size], static.positions[:size], inputs)

        # Warm up on a side stream (compiles flex_attention for this shape), as torch's graph docs ask.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                forward()
        torch.cuda.current_stream().wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = forward()
        self.graphs[size] = (graph, logits)
        return graph, logits


def decode_runner(device: torch.device, disable_cuda_graph: bool, max_bs: int, max_blocks_per_seq: int) -> DecodeRunner:
    if device.type == "cuda" and not disable_cuda_graph:
        return CudaGraphDecode(max_bs, max_blocks_per_seq)
    return EagerDecode()


def kv_pool_for(
    model: torch.nn.Module,
    block_size: int,
    context_length: int,
    max_total_tokens: int,
    cpu_tokens: int,
    mem_fraction_static: float,
) -> BlockPool:
    """The KV block pool for ``model`` on its device.

    CPU: ``max_total_tokens`` (or ``cpu_tokens``, today's limits) claimed as needed. CUDA: allocated
    now, as many tokens as :func:`cuda_cache_tokens` gives.
    """
    layout = KVLayout.of(model)
    if layout.device.type != "cuda":
        tokens = max_total_tokens or cpu_tokens
        return BlockPool(layout, block_size, -(-tokens // block_size) + 1, initial_blocks=64)
    free, total = (0, 0) if max_total_tokens else torch.cuda.mem_get_info(layout.device)
    tokens = cuda_cache_tokens(layout, block_size, context_length, max_total_tokens, mem_fraction_static, free, total)
    return BlockPool(layout, block_size, -(-tokens // block_size) + 1)


def cuda_cache_tokens(
    layout: KVLayout,
    block_size: int,
    context_length: int,
    max_total_tokens: int,
    mem_fraction_static: float,
    free: int,
    total: int,
) -> int:
    """Tokens of a CUDA pool: ``max_total_tokens``, or what ``mem_fraction_static`` leaves
    (:func:`cache_tokens`), never past what 32-bit offsets reach in one layer's tensor.

    A layer's keys are one ``[kv_heads, tokens, head_dim]`` tensor read by the attention kernels
    with 32-bit offsets. Past 2**31 elements Triton passes a size as int64, and flex_attention's
    decode template then fails to compile (on the H200, a ``tiny`` engine at 0.88 of the card:
    "Ternary expression with dynamic condition has inconsistent types int64 and int32"). A real
    model's cache stays well below (Qwen2.5-0.5B: 16.7 M tokens); a small test model's would not.
    """
    limit = addressable_tokens(layout, block_size)
    if max_total_tokens > limit:
        raise SettingsError(
            "EngineSettings",
            [
                f"RELAYRL_ENGINE_MAX_TOTAL_TOKENS={max_total_tokens} is more than one layer's KV tensor can address"
                f" with 32-bit offsets ({limit} tokens at {layout.kv_heads} KV heads of {layout.head_dim}); lower it"
            ],
        )
    if max_total_tokens:
        return max_total_tokens
    tokens = cache_tokens(free, total, mem_fraction_static, layout.bytes_per_token, context_length)
    if tokens > limit:
        log.info("KV cache: %d tokens, the most 32-bit offsets address (the memory fraction leaves %d)", limit, tokens)
    return min(tokens, limit)


def addressable_tokens(layout: KVLayout, block_size: int) -> int:
    """The most tokens a pool holds with every layer's ``[kv_heads, tokens, head_dim]`` below 2**31
    elements (block 0, the scratch block, counted in the tensor but not in the tokens)."""
    blocks = (2**31 - 1) // (layout.kv_heads * layout.head_dim * block_size)
    return (blocks - 1) * block_size


def cache_tokens(free: int, total: int, mem_fraction_static: float, bytes_per_token: int, context_length: int) -> int:
    """Tokens of KV cache that ``mem_fraction_static`` leaves on a GPU with ``free`` of ``total``
    bytes free once the weights are loaded (SGLang's rule: the free memory less the part of the
    card kept for others); :class:`~relayrl.config.SettingsError` naming the setting when that is
    not one context."""
    room = max(free - total * (1 - mem_fraction_static), 0)
    tokens = int(room // bytes_per_token)
    if tokens < context_length:
        raise SettingsError(
            "EngineSettings",
            [
                f"RELAYRL_ENGINE_MEM_FRACTION_STATIC={mem_fraction_static} leaves no room for the KV cache:"
                f" {room / 2**30:.2f} GiB of {total / 2**30:.1f} GiB after the weights hold"
                f" {tokens} tokens, fewer than one context ({context_length}); raise it or lower context_length"
            ],
        )
    return tokens
