"""Settings of the built-in CPU engine (``relayrl engine serve``), read from ``RELAYRL_ENGINE_*``."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import Field

from relayrl.config import ServiceSettings


class EngineSettings(ServiceSettings):
    """The engine serves SGLang's native HTTP API on ``http_port``; it has no gRPC server."""

    service_name: ClassVar[str] = "engine"

    model_path: str = Field("", description="Hugging Face causal LM directory to serve (config.json, safetensors).")
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$", description="Torch dtype of the weights.")
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
        " the version the engine holds). Empty: every update is copied into the parameters.",
    )
    health_generate_timeout_s: float = Field(
        20.0, gt=0, description="Longest time /health_generate waits for its one-token generation."
    )

    def resolved_torch_threads(self) -> int:
        """``torch_threads``, with 0 resolved to the CPUs in this process's affinity set."""
        return self.torch_threads or len(os.sched_getaffinity(0))
