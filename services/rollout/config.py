"""Settings of one rollout replica (``relayrl rollout serve``), read from ``RELAYRL_ROLLOUT_*``.

verl names: ``partial_rollout_mode`` selects what happens to a generation that a weight update
interrupts (verl's fully-async ``partial_rollout``); ``max_inflight_prompts`` is the
replica's share of verl's ``max_concurrent_samples`` divided by ``n``; ``generation_timeout``
is ``engine_timeout_s``.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from relayrl.config import ServiceSettings, shared_field


class RolloutSettings(ServiceSettings):
    service_name: ClassVar[str] = "rollout"

    replica_id: str = Field("rollout-0", min_length=1, description="This replica's name in leases and version reports.")
    engine_url: str = Field("http://127.0.0.1:30000", description="Base URL of the engine's SGLang HTTP API.")
    queue_address: str = Field("127.0.0.1:50051", description="host:port of the queue service's gRPC server.")
    paramsync_address: str = Field(
        "", description="host:port of paramsync's gRPC server; empty: no weight updates (fixed policy)."
    )
    max_staleness: int = shared_field(
        "max_staleness",
        1,
        "η: a group whose oldest token version is more than η behind the newest announced version is"
        " dropped (counted as dropped_stale_samples) and its prompt left to be re-issued.",
        ge=0,
    )
    max_inflight_prompts: int = Field(
        8, ge=1, description="Prompts generated at once; each sends n requests to the engine."
    )
    lease_block_timeout_s: float = Field(1.0, gt=0, description="Longest wait of one Lease call for prompts.")
    temperature: float = Field(1.0, ge=0, description="Default sampling temperature (prompts may override).")
    top_p: float = Field(1.0, gt=0, le=1, description="Default nucleus sampling mass.")
    top_k: int = Field(-1, ge=-1, description="Default top-k; -1 disables it.")
    max_new_tokens: int = Field(256, ge=1, description="Default response length budget, tokens.")
    partial_rollout_mode: str = Field(
        "abort_resume",
        pattern="^(abort_resume|in_place|restart)$",
        description="On a weight update mid-generation: 'abort_resume' aborts and resubmits prompt + generated"
        " tokens with the remaining budget (per-token versions kept); 'in_place' keeps generating under the"
        " new weights; 'restart' discards the partial response and starts again.",
    )
    reward_function: str = Field(
        "auto",
        description="'auto' (by data_source: relayrl/* built-in tasks, *gsm8k*, math sets, else exact match),"
        " 'gsm8k', 'math', 'exact', 'builtin', or 'module:function' with verl's"
        " compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict.",
    )
    reward_timeout_s: float = Field(10.0, gt=0, description="Longest a reward call may take; then reward 0.")

    # --- recipe: DAPO soft overlong punishment (verl reward_model.overlong_buffer.*) ---
    overlong_buffer_enable: bool = Field(
        False, description="verl overlong_buffer.enable: punish responses within overlong_buffer_len of the budget."
    )
    overlong_buffer_len: int = Field(
        4, ge=1, description="verl overlong_buffer.len: tokens before the budget where the penalty ramps to its max."
    )
    overlong_buffer_penalty_factor: float = Field(
        1.0, ge=0, description="verl overlong_buffer.penalty_factor: the penalty at the full budget."
    )
    engine_timeout_s: float = Field(
        600.0, gt=0, description="Bound on one engine call, generation included (verl's generation_timeout)."
    )
    engine_retries: int = Field(3, ge=0, description="Retries of an engine call that failed transiently.")
    engine_check_interval_s: float = Field(1.0, gt=0, description="Period of the engine health probe, seconds.")
    weights_shm_dir: str = Field(
        "/dev/shm",
        description="Memory-backed directory (tmpfs) each pulled version is received into, as a safetensors"
        " file the engine maps and copies into its parameters; the engine must see it at the same path (same"
        " host, or one memory volume in the pod). Empty, or a directory that does not exist: weights_dir.",
    )
    weights_dir: str = Field(
        "",
        description="Where pulled versions are received when weights_shm_dir is not available (a file per"
        " version on disk); empty: a temporary dir.",
    )
    push_timeout_s: float = Field(60.0, gt=0, description="Longest wait for queue capacity on a push, seconds.")
