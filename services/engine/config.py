"""Settings of the built-in engine (``relayrl engine serve``), read from ``RELAYRL_ENGINE_*``."""

from __future__ import annotations

import os
from typing import ClassVar, Literal

from pydantic import Field

from relayrl.config import ServiceSettings
from relayrl.devices import Device

AttentionBackend = Literal["auto", "torch_native", "flex_attention", "triton"]
SamplingBackend = Literal["auto", "pytorch", "triton"]


class EngineSettings(ServiceSettings):
    """The engine serves SGLang's native HTTP API on ``http_port``; it has no gRPC server."""

    service_name: ClassVar[str] = "engine"

    model_path: str = Field("", description="Hugging Face causal LM directory to serve (config.json, safetensors).")
    device: Device = Field(
        "cpu", description="Where the engine computes: cpu, or cuda (the current CUDA device; refused without one)."
    )
    dtype: str = Field(
        "auto",
        pattern="^(auto|float32|bfloat16|float16)$",
        description="Torch dtype of the weights and the KV cache; auto: float32 on cpu, bfloat16 on cuda.",
    )
    page_size: int = Field(
        0,
        ge=0,
        description="Tokens per block of the paged KV cache (SGLang's page_size); the prefix cache shares whole"
        " blocks and copies the last, partial one. 0: 16 on cpu, 128 on cuda (flex_attention's KV block).",
    )
    mem_fraction_static: float = Field(
        0.88,
        gt=0,
        lt=1,
        description="cuda only: the fraction of the GPU's memory for the weights and the KV cache (SGLang's name);"
        " the KV cache gets what is left of it after the weights, so a trainer can share the GPU with what remains."
        " A fraction that leaves no room for one context_length of cache stops the engine at start.",
    )
    max_total_tokens: int = Field(
        0,
        ge=0,
        description="Tokens the KV cache holds (SGLang's name). 0: on cpu, max_running_requests x context_length"
        " plus the prefix cache's budget, claimed as it is needed; on cuda, what mem_fraction_static leaves, up to"
        " what 32-bit offsets address in one layer's [kv_heads, tokens, head_dim] tensor (a larger value stops the"
        " engine at start).",
    )
    attention_backend: AttentionBackend = Field(
        "auto",
        description="Attention over the paged KV cache (SGLang's name): torch_native (SDPA over each sequence's"
        " gathered blocks), flex_attention (torch's flex_attention with a block mask over the pages) or triton"
        " (a Triton kernel for decode steps, cuda only); auto: torch_native on cpu, flex_attention on cuda (and"
        " torch_native, with the reason in the log, where its kernels fail to build at start on the host's torch;"
        " a backend set explicitly stops the engine instead).",
    )
    triton_attention_num_kv_splits: int = Field(
        0,
        ge=0,
        le=16,
        description="The triton backend's decode kernel cuts each row's keys into this many splits, run side by"
        " side and merged (flash-decoding; SGLang's name, its default 8): more for few rows of long context. 0: as"
        " many as give every multiprocessor two programs at the step's batch size (1 from 132 rows of two KV heads"
        " on an H200), at most 16.",
    )
    sampling_backend: SamplingBackend = Field(
        "auto",
        description="The kernels that draw each step's tokens (SGLang's name): pytorch (a few passes of torch"
        " operations over the step's logits) or triton (one Triton kernel reading each row's logits once, cuda"
        " only; a batch with a top-k or top-p row takes pytorch's path); auto: triton on cuda, pytorch on cpu.",
    )
    disable_cuda_graph: bool = Field(
        False, description="cuda only: decode eagerly instead of replaying CUDA graphs (SGLang's name)."
    )
    cuda_graph_max_bs: int = Field(
        256,
        ge=1,
        description="cuda only: the largest decode batch replayed from a CUDA graph (SGLang's name); graphs are"
        " captured at 1, 2, 4, 8 and every multiple of 16 up to it, and larger batches decode eagerly. A decode"
        " batch never exceeds max_running_requests, so capture stops there when that is smaller.",
    )
    max_running_requests: int = Field(
        64, ge=1, description="Sequences decoded together in one batched forward pass (SGLang's name)."
    )
    max_prefill_tokens: int = Field(
        512,
        ge=1,
        description=(
            "Prompt tokens one step may prefill (SGLang's name): only tokens the prefix cache does not give count,"
            " and the samples of one prompt count once. Requests past it wait for the next step, which decodes the"
            " running ones first; a longer prompt is prefilled alone."
        ),
    )
    disable_overlap_schedule: bool = Field(
        False,
        description=(
            "Read each step's sampled tokens back before queuing the next decode pass (SGLang's name). By default the"
            " pass is queued first, on the tokens where they lie, so the GPU runs it while the host streams the step's"
            " tokens and admits requests; a row that sampled its stop token is computed once more and dropped."
        ),
    )
    torch_profiler_dir: str = Field(
        "/tmp",
        description="Where /start_profile writes its trace and summary when the request names no output_dir"
        " (SGLang's SGLANG_TORCH_PROFILER_DIR).",
    )
    prefix_cache_mb: int = Field(
        256,
        ge=0,
        description=(
            "MiB of finished sequences' keys and values kept so that a prompt continuing one (the next turn of a"
            " conversation) is prefilled from its new tokens only, as SGLang's radix cache does; least recently used"
            " first out, and cleared at every weight update. 0 keeps none."
        ),
    )
    context_length: int = Field(
        0, ge=0, description="Longest prompt + output in tokens; 0 uses the model's max_position_embeddings."
    )
    torch_threads: int = Field(
        0,
        ge=0,
        description=(
            "torch intra-op threads; 0 uses every CPU this process may run on (os.sched_getaffinity). "
            "The local stack passes an explicit count so the engine and the trainer do not share cores."
        ),
    )
    seed: int = Field(0, ge=0, description="Seed of the sampling generator, for reproducible runs.")
    weight_version: str = Field(
        "0", description="weight_version reported before any update (SGLang's --weight-version; RelayRL uses 0)."
    )
    shared_weights_dir: str = Field(
        "",
        description="Directory whose safetensors files /update_weights_from_disk serves in place: a whole"
        " version's parameters become views of the file's mapping instead of copies, so the model costs no"
        " memory of its own beside the file. Whoever writes there must never change a file while the engine"
        " serves it, which the rollout replica keeps for its weights_shm_dir (it reuses only files older than"
        " the version the engine holds). Empty: every update is copied into the parameters. cpu only: a CUDA"
        " engine's parameters live in GPU memory, so there every update is copied (logged once at start).",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        description="A streamed /generate (stream: true) sends a chunk after the first token and then every this"
        " many tokens (SGLang's name): larger values cost the engine fewer chunks at the price of coarser streaming.",
    )
    incremental_streaming_output: bool = Field(
        False,
        description="A streamed /generate's chunks hold only what is new since the previous chunk (text,"
        " output_ids, output_token_logprobs) instead of everything so far (SGLang's name and default).",
    )
    health_generate_timeout_s: float = Field(
        20.0, gt=0, description="Longest time /health_generate waits for its one-token generation."
    )

    def resolved_dtype(self) -> str:
        """``dtype``, with auto resolved for the device."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device == "cuda" else "float32"

    def resolved_page_size(self) -> int:
        """``page_size``, with 0 resolved for the device."""
        return self.page_size or (128 if self.device == "cuda" else 16)

    def resolved_attention_backend(self) -> Literal["torch_native", "flex_attention", "triton"]:
        """``attention_backend``, with auto resolved for the device."""
        if self.attention_backend != "auto":
            return self.attention_backend
        return "flex_attention" if self.device == "cuda" else "torch_native"

    def resolved_sampling_backend(self) -> Literal["pytorch", "triton"]:
        """``sampling_backend``, with auto resolved for the device."""
        if self.sampling_backend != "auto":
            return self.sampling_backend
        return "triton" if self.device == "cuda" else "pytorch"

    def resolved_cuda_graph_max_bs(self) -> int:
        """``cuda_graph_max_bs``, capped at the largest decode batch there can be (``max_running_requests``)."""
        return min(self.cuda_graph_max_bs, self.max_running_requests)

    def resolved_shared_weights_dir(self) -> str:
        """``shared_weights_dir`` where parameters can be views of a mapped file (cpu); empty on cuda."""
        return self.shared_weights_dir if self.device == "cpu" else ""

    def resolved_torch_threads(self) -> int:
        """``torch_threads``, with 0 resolved to the CPUs in this process's affinity set."""
        return self.torch_threads or len(os.sched_getaffinity(0))
