"""Attention over the paged KV cache: three candidates behind one small interface.

The model stays the Hugging Face model: its attention layers call the function registered here
(``attn_implementation = "relayrl_paged"``) with each layer's queries and the new tokens' keys and
values after RoPE. The function stores those keys and values in the :class:`BlockPool` and hands
the queries to the pass's :class:`AttentionBackend`, which reads every sequence's keys and values
through its block table. A backend prepares a *plan* once per forward pass (shared by every
layer) and attends with it per layer:

- ``torch_native``: each sequence's blocks are gathered into a dense ``[B, kv_heads, W, head_dim]``
  (W the longest sequence of the pass) and fed to ``scaled_dot_product_attention`` with a mask
  that hides each shorter row's tail: the simplest correct path, and the CPU default.
- ``flex_attention``: torch's ``flex_attention`` reads the pool in place through a block mask
  whose KV blocks are the sequence's pages (the design of ``torch.nn.attention.experimental.
  _paged_attention``): no gather, and its plan's tensors keep fixed shapes, so a decode step can
  be replayed from a CUDA graph. A KV head's query group attends as rows of one query, so each
  page is read once per group. Compiled on CUDA; on CPU it runs eagerly (slow, for tests).
- ``triton``: a Triton kernel (``triton_attention.py``) for passes of one query per row (decode
  steps), reading the pages in place with each KV head's query group together; longer passes
  (prefill) take ``torch_native``'s path. Its decode plan has fixed shapes, so decode steps replay
  from CUDA graphs. CUDA only (on CPU Triton runs only in its interpreter, which the tests use).

A backend that can be captured in a CUDA graph says so (``graphable``): its decode plan reads
nothing back to the host and keeps its shapes from step to step. One whose kernels are built at
their first use (``torch.compile``, Triton's JIT) says so too (``compiles``): the engine then runs
:meth:`~services.engine.model_runner.ModelRunner.warm_up` at start.

A token at position ``p`` of a row sees the row's tokens ``[0, p]``; padding tokens of a batched
pass sit at position 0 and write to the pool's scratch block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from services.engine.kv_pool import SCRATCH_BLOCK, BlockPool, KVLayout

ATTN_IMPLEMENTATION = "relayrl_paged"


@dataclass(frozen=True, slots=True)
class PassInputs:
    """What one forward pass over the paged cache needs, on the model's device.

    ``tables_BN`` holds each row's block table padded with the scratch block, ``positions_BL``
    each query token's position (0 for padding), ``lengths_B`` each row's tokens after the pass;
    ``longest`` is the largest of them, known on the host (a plan sizes its gather by it without
    reading the device).
    """

    write_index_BL: torch.Tensor
    tables_BN: torch.Tensor
    positions_BL: torch.Tensor
    lengths_B: torch.Tensor
    longest: int


class AttentionBackend(Protocol):
    name: str
    graphable: bool
    compiles: bool

    def plan(self, pool: BlockPool, inputs: PassInputs) -> Any: ...

    def attend(self, plan: Any, pool: BlockPool, layer: int, query_BHLD: torch.Tensor, scale: float) -> torch.Tensor:
        """The attention output ``[B, L, heads, head_dim]``."""
        ...


def fold_groups(query_BHLD: torch.Tensor, group: int) -> torch.Tensor:
    """``[B, heads, L, D]`` -> ``[B, kv_heads, L x group, D]``: the query heads that share a KV head
    as the rows of one query, token ``l``'s head ``g`` of the group at row ``l x group + g``."""
    batch, heads, queries, head_dim = query_BHLD.shape
    folded = query_BHLD.view(batch, heads // group, group, queries, head_dim).transpose(2, 3)
    return folded.reshape(batch, heads // group, queries * group, head_dim)


def unfold_groups(out_BKRD: torch.Tensor, group: int) -> torch.Tensor:
    """The attention output of folded queries as ``[B, L, heads, D]``."""
    batch, kv_heads, rows, head_dim = out_BKRD.shape
    out = out_BKRD.view(batch, kv_heads, rows // group, group, head_dim).permute(0, 2, 1, 3, 4)
    return out.reshape(batch, rows // group, kv_heads * group, head_dim)


def folded_positions(positions_BL: torch.Tensor, group: int) -> torch.Tensor:
    """Each folded query row's position, ``[B, L x group]``."""
    batch, queries = positions_BL.shape
    return positions_BL[:, :, None].expand(batch, queries, group).reshape(batch, queries * group)


class GatherSDPA:
    """``torch_native``: SDPA over each sequence's blocks gathered into a dense tensor."""

    name = "torch_native"
    # The gather's width is the longest row of the step, which changes every step.
    graphable = False
    compiles = False

    def plan(self, pool: BlockPool, inputs: PassInputs) -> tuple[torch.Tensor, torch.Tensor]:
        columns = torch.arange(inputs.longest, device=inputs.tables_BN.device)
        blocks_BW = inputs.tables_BN[:, columns // pool.block_size]
        index_BW = blocks_BW * pool.block_size + columns % pool.block_size
        mask_B1LW = (columns <= inputs.positions_BL[:, :, None])[:, None]
        return index_BW, mask_B1LW

    def attend(self, plan: Any, pool: BlockPool, layer: int, query_BHLD: torch.Tensor, scale: float) -> torch.Tensor:
        index_BW, mask_B1LW = plan
        # [kv_heads, B, W, head_dim] -> [B, kv_heads, W, head_dim]
        keys = pool.keys[layer][:, index_BW].transpose(0, 1)
        values = pool.values[layer][:, index_BW].transpose(0, 1)
        out = F.scaled_dot_product_attention(
            query_BHLD, keys, values, attn_mask=mask_B1LW, scale=scale, enable_gqa=True
        )
        return out.transpose(1, 2)


class FlexPaged:
    """``flex_attention``: the pool read in place through a block mask over its pages.

    The queries are folded (:func:`fold_groups`): a decode step's ``group`` rows share one query
    tile instead of each query head filling one of its 128 rows, and each page is read once per
    group. (Its decoding kernel stays out of reach: inductor's ``_use_flex_decoding`` wants a batch
    fixed at compile time, and the engine compiles once for every batch.)
    """

    name = "flex_attention"
    graphable = True

    def __init__(self, compiled: bool, group: int) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self.compiles = compiled
        self.group = group
        self._flex = torch.compile(flex_attention, dynamic=True) if compiled else flex_attention

    def plan(self, pool: BlockPool, inputs: PassInputs) -> Any:
        return paged_block_mask(pool, inputs.tables_BN, inputs.lengths_B, inputs.positions_BL, self.group)

    def attend(self, plan: Any, pool: BlockPool, layer: int, query_BHLD: torch.Tensor, scale: float) -> torch.Tensor:
        keys = pool.keys[layer][None]  # [1, kv_heads, pool tokens, head_dim]: every row reads the one pool
        values = pool.values[layer][None]
        out = self._flex(fold_groups(query_BHLD, self.group), keys, values, block_mask=plan, scale=scale)
        return unfold_groups(out, self.group)


# flex_attention's query block: a decode step or a short prefill is one block of rows.
Q_BLOCK = 128


def paged_block_mask(
    pool: BlockPool, tables_BN: torch.Tensor, lengths_B: torch.Tensor, positions_BL: torch.Tensor, group: int
) -> Any:
    """A block mask over the pool's pages for queries folded as :class:`FlexPaged` folds them: a
    query at position ``p`` of row ``b`` sees the pool tokens holding the row's positions ``[0, p]``.

    Each block of query rows visits its row's pages, split as flex_attention's kernels want them:
    the leading pages every query of the block sees whole are *full* (the kernel skips the mask
    there), the rest up to the row's length *partial* (the mask decides per token). A decode step
    so evaluates the mask on the row's last page only. ``mask_mod`` alone is still the whole truth:
    flex_attention's eager path (CPU) ignores the blocks and applies it to every token of the pool.

    Every tensor it holds has a shape fixed by the batch, the query length and the pool, so a
    caller may refill them in place (the CUDA graph runner does) and the mask stays valid.
    """
    from torch.nn.attention.flex_attention import BlockMask

    batch, queries = positions_BL.shape
    device, page, width = tables_BN.device, pool.block_size, tables_BN.shape[1]
    used_B = (lengths_B + page - 1) // page
    # Physical block -> its logical index in the row, -1 where the row does not hold it.
    logical_BP = torch.full((batch, pool.capacity), -1, dtype=torch.int32, device=device)
    columns_N = torch.arange(width, device=device)
    held = columns_N < used_B[:, None]
    logical_BP.scatter_(
        1, torch.where(held, tables_BN, SCRATCH_BLOCK), torch.where(held, columns_N, -1).to(torch.int32)
    )
    # A row holding nothing (a CUDA graph's padding row) sees the scratch block's first token.
    logical_BP[:, SCRATCH_BLOCK] = torch.where(used_B == 0, 0, -1).to(torch.int32)
    visited_B = used_B.clamp(min=1)

    rows = queries * group
    row_blocks = -(-rows // Q_BLOCK)
    # The lowest position among each block's query rows (past the last row: none, so no bound).
    positions_BR = F.pad(
        folded_positions(positions_BL, group), (0, row_blocks * Q_BLOCK - rows), value=torch.iinfo(torch.int64).max // 2
    )
    lowest_BK = positions_BR.view(batch, row_blocks, Q_BLOCK).amin(-1)
    full_BK = torch.minimum((lowest_BK + 1) // page, visited_B[:, None])
    # Partial pages: logical [full, visited), moved to the front of their list.
    shifted_BKN = (full_BK[:, :, None] + columns_N).clamp(max=width - 1)
    partial_BKN = tables_BN.gather(1, shifted_BKN.view(batch, -1)).view(batch, row_blocks, width)

    def indices(of_BKN: torch.Tensor) -> torch.Tensor:
        out = torch.zeros((batch, 1, row_blocks, pool.capacity), dtype=torch.int32, device=device)
        out[:, 0, :, :width] = of_BKN
        return out

    return BlockMask.from_kv_blocks(
        (visited_B[:, None] - full_BK).to(torch.int32)[:, None],
        indices(partial_BKN.to(torch.int32)),
        full_BK.to(torch.int32)[:, None],
        indices(tables_BN.to(torch.int32)[:, None].expand(batch, row_blocks, width)),
        BLOCK_SIZE=(Q_BLOCK, page),
        mask_mod=_paged_mask(logical_BP, positions_BL, page, group),
        seq_lengths=(rows, pool.capacity * page),
        # The transposed lists serve only the backward pass; building them would sort the pool's
        # blocks for every row at every step.
        compute_q_blocks=False,
    )


def _paged_mask(logical_BP: torch.Tensor, positions_BL: torch.Tensor, page: int, group: int) -> Any:
    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        logical = logical_BP[b, kv // page]
        return (logical >= 0) & (logical * page + kv % page <= positions_BL[b, q // group])

    return mask_mod


class TritonPaged:
    """``triton``: a Triton kernel for decode steps, SDPA over gathered blocks for longer passes."""

    name = "triton"
    graphable = True
    compiles = True

    def __init__(self, kv_splits: int = 0) -> None:
        from services.engine import triton_attention

        self._kernel = triton_attention
        self._prefill = GatherSDPA()
        self.kv_splits = kv_splits

    def plan(self, pool: BlockPool, inputs: PassInputs) -> Any:
        if inputs.positions_BL.shape[1] == 1:
            return inputs
        return self._prefill.plan(pool, inputs)

    def attend(self, plan: Any, pool: BlockPool, layer: int, query_BHLD: torch.Tensor, scale: float) -> torch.Tensor:
        if not isinstance(plan, PassInputs):
            return self._prefill.attend(plan, pool, layer, query_BHLD, scale)
        keys, values = pool.keys[layer], pool.values[layer]
        return self._kernel.paged_decode(
            query_BHLD, keys, values, plan.tables_BN, plan.positions_BL, pool.block_size, scale, self.kv_splits
        )


def backend_named(name: str, device: torch.device, group: int, kv_splits: int = 0) -> AttentionBackend:
    """The backend ``name`` for a model on ``device`` whose KV heads serve ``group`` query heads each;
    ``kv_splits`` is the triton decode kernel's (0: by the batch, :func:`triton_attention.decode_splits`)."""
    if name == "torch_native":
        return GatherSDPA()
    if name == "flex_attention":
        return FlexPaged(compiled=device.type == "cuda", group=group)
    if name == "triton":
        return _triton(device, kv_splits)
    raise ValueError(f"unknown attention backend {name!r}; choose torch_native, flex_attention or triton")


def _triton(device: torch.device, kv_splits: int) -> AttentionBackend:
    """The triton backend, or one line naming the setting where it cannot run."""
    from relayrl.config import SettingsError

    def refused(why: str) -> SettingsError:
        return SettingsError("EngineSettings", [f"RELAYRL_ENGINE_ATTENTION_BACKEND=triton: {why}"])

    try:
        backend = TritonPaged(kv_splits)
    except ImportError as exc:
        raise refused(f"Triton is not installed ({exc}); choose flex_attention or torch_native") from None
    if device.type != "cuda" and not backend._kernel.interpreted():
        raise refused(f"Triton kernels run on CUDA, not {device.type}; choose torch_native or flex_attention")
    return backend


def query_group(model: torch.nn.Module) -> int:
    """Query heads per KV head of ``model`` (grouped-query attention; 1 without)."""
    return int(model.config.num_attention_heads) // KVLayout.of(model).kv_heads


@dataclass(frozen=True, slots=True)
class PagedPass:
    """The context every attention layer of one forward pass gets (as the ``relayrl_pass`` kwarg)."""

    pool: BlockPool
    backend: AttentionBackend
    plan: Any
    write_index_BL: torch.Tensor


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    relayrl_pass: PagedPass | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Hugging Face's attention-function signature: stores the new keys and values, then attends.

    Called outside a runner's pass (a plain ``model(input_ids)`` on the same model, as tests and
    benchmarks do), it is transformers' SDPA attention; transformers builds no mask for a custom
    implementation, so such a call must be unpadded (it is then causal).
    """
    if relayrl_pass is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    layer = module.layer_idx
    relayrl_pass.pool.write(layer, relayrl_pass.write_index_BL, key, value)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return relayrl_pass.backend.attend(relayrl_pass.plan, relayrl_pass.pool, layer, query, scale), None


@functools.cache
def register() -> str:
    """Registers :func:`paged_attention` with transformers (once) and returns its implementation name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention)
    return ATTN_IMPLEMENTATION
