"""Settings of one rollout replica (``relayrl rollout serve``), read from ``RELAYRL_ROLLOUT_*``.

verl names: ``partial_rollout_mode`` selects what happens to a generation that a weight update
interrupts (verl's fully-async ``partial_rollout``); ``max_inflight_prompts`` is the
replica's share of verl's ``max_concurrent_samples`` divided by ``n``; ``generation_timeout``
is ``engine_timeout_s``.

Rewards come from rule functions (``reward_function``), from a reward-model service, or both
(``reward_kind``). The issue's nested ``reward: {kind: model, url, timeout}`` is spelled flat
here, as every other setting: ``reward_kind``, ``reward_model_url``, ``reward_model_timeout_s``
(``RELAYRL_ROLLOUT_REWARD_KIND`` ...). A model-scored group never falls back to reward 0: while
the service is down the group waits (bounded retries with backoff) for up to
``reward_model_deadline_s``, then its prompt is given back to the queue (reason
``reward_unavailable``) and the replica leases nothing until the service is ready again.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from relayrl.config import ServiceSettings, shared_field

PARTIAL_ROLLOUT_MODES = ("abort_resume", "in_place", "restart")


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
    source: Literal["prompts", "agents"] = Field(
        "prompts",
        description="'prompts': lease the trainer's prompts and generate them; 'agents': agent-only training, the"
        " replica leases nothing and generates only for agents through its OpenAI endpoint, whose finished"
        " conversations are the trainer's groups (the stack sets trainer.prompt_source to match).",
    )
    max_inflight_prompts: int = Field(
        8,
        ge=1,
        le=4096,
        description="Prompts generated at once; each sends n requests to the engine. At most 4,096: the leases"
        " one queue call may name.",
    )
    lease_block_timeout_s: float = Field(1.0, gt=0, description="Longest wait of one Lease call for prompts.")
    temperature: float = Field(1.0, ge=0, description="Default sampling temperature (prompts may override).")
    top_p: float = Field(1.0, gt=0, le=1, description="Default nucleus sampling mass.")
    top_k: int = Field(-1, ge=-1, description="Default top-k; -1 disables it.")
    max_new_tokens: int = Field(256, ge=1, description="Default response length budget, tokens.")
    partial_rollout_mode: str = Field(
        "abort_resume",
        pattern=f"^({'|'.join(PARTIAL_ROLLOUT_MODES)})$",
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

    # --- reward model (services/reward; the reward: {kind, url, timeout}) ---
    reward_kind: Literal["rule", "model", "rule+model"] = Field(
        "rule",
        description="'rule': reward_function alone; 'model': the reward service's score alone;"
        " 'rule+model': reward_rule_weight × rule + reward_model_weight × model (a weighted sum).",
    )
    reward_model_url: str = Field(
        "", description="Base URL of the reward service (POST /score); required when reward_kind uses the model."
    )
    reward_model_timeout_s: float = Field(
        30.0, gt=0, description="Longest one /score call may take, seconds; a call that times out is retried."
    )
    reward_model_deadline_s: float = Field(
        120.0,
        gt=0,
        description="Longest a group waits for its scores while the reward service fails (retries with backoff),"
        " seconds; then its prompt is given back to the queue, never scored 0.",
    )
    reward_model_retry_wait_s: float = Field(
        0.5, gt=0, description="First wait between /score retries, doubled per retry up to 5 s."
    )
    reward_rule_weight: float = Field(1.0, description="Weight of the rule reward in 'rule+model'.")
    reward_model_weight: float = Field(
        1.0, description="Weight of the reward model's score in 'model' and 'rule+model'."
    )

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
        " file the engine maps and serves in place (its shared_weights_dir) or copies into its parameters; the"
        " engine must see it at the same path (same host, or one memory volume in the pod). Empty, or a"
        " directory that does not exist: weights_dir.",
    )
    weights_map_shared_memory: bool = Field(
        True,
        description="On paramsync's host, give the engine each version as a path to paramsync's own memory"
        " file (it maps what the trainer uploaded) instead of receiving a copy into weights_shm_dir; the"
        " engine must be able to open this replica's /proc/<pid>/fd files (same host, same process"
        " namespace). Elsewhere, or when false: every version is received.",
    )
    load_weights_by_handle: bool = Field(
        True,
        description="Load a version through the handles the trainer shares on this host (its "
        "share_weights_by_handle: CUDA IPC on a GPU) instead of its bytes. False where the engine cannot open "
        "them: the handles point into trainer rank 0's GPU (the local stack sets it for engines on another GPU).",
    )
    weights_dir: str = Field(
        "",
        description="Where pulled versions are received when weights_shm_dir is not available (a file per"
        " version on disk); empty: a temporary dir.",
    )
    lora_alpha: float = Field(
        16.0,
        gt=0,
        description="LoRA alpha of the adapter versions a LoRA trainer publishes (verl lora_alpha; must equal the"
        " trainer's): a version holds the adapter's tensors only, whose rank and modules they show themselves.",
    )
    push_timeout_s: float = Field(60.0, gt=0, description="Longest wait for queue capacity on a push, seconds.")
    pause_wait_s: float = Field(
        5.0,
        ge=0,
        description="Longest a generation in flight (a leased prompt, an episode, an OpenAI request) waits for an"
        " operator's pause to end, seconds from the pause; then a leased prompt is given back to the queue"
        " (reason 'paused') and an OpenAI request is answered 503 with Retry-After. A new OpenAI request on a"
        " paused or stopping replica is answered 503 at once.",
    )
    retry_after_s: int = Field(
        5, ge=1, description="The Retry-After (seconds) of a 503 from a paused or stopping replica's OpenAI endpoint."
    )

    # --- multi-turn episodes: tools and interactions (verl's actor_rollout_ref.rollout.multi_turn.*) ---
    multi_turn_enable: bool = Field(
        False,
        description="verl multi_turn.enable: each sample is an agent episode (generate, run tool calls or the"
        " interaction, append their answer as observation tokens, generate again); off: single-turn samples.",
    )
    multi_turn_max_assistant_turns: int = Field(
        5, ge=1, description="verl multi_turn.max_assistant_turns: model turns after which an episode ends."
    )
    multi_turn_max_tokens_per_turn: int = Field(
        0,
        ge=0,
        description="Most tokens one model turn may generate (a cut-off turn is closed by masked template tokens"
        " and answered); 0: a turn may use the episode's remaining budget. The episode's budget, every token"
        " after the prompt, is max_new_tokens (verl's response_length).",
    )
    multi_turn_max_parallel_calls: int = Field(
        1,
        ge=1,
        description="verl multi_turn.max_parallel_calls: tool calls of one turn that run; later ones are ignored.",
    )
    multi_turn_tool_config_path: str = Field(
        "", description="verl multi_turn.tool_config_path: YAML of `tools: - class_name, config, tool_schema`."
    )
    multi_turn_interaction_config_path: str = Field(
        "",
        description="verl multi_turn.interaction_config_path: YAML of `interaction: - name, class_name, config`;"
        " a row talks to the one its extra_info.interaction_kwargs.name picks. builtin:<task> is the one a"
        " built-in task ships with (builtin:guess).",
    )
    multi_turn_tool_concurrency: int = Field(
        64, ge=1, description="Tool and interaction calls running at once on this replica, over all episodes."
    )
    multi_turn_tool_timeout_s: float = Field(
        30.0, gt=0, description="Longest one tool call may run; then the model is told it timed out."
    )
    multi_turn_max_tool_response_length: int = Field(
        256,
        ge=1,
        description="verl multi_turn.max_tool_response_length: characters of a tool's answer kept (cut on the right).",
    )
    tokenizer_path: str = Field(
        "",
        description="Tokenizer directory for rendering observations with the model's chat template; empty: the"
        " tokenizer_path the engine reports in /get_model_info (multi-turn only).",
    )

    # --- OpenAI-compatible endpoint (/v1/chat/completions; agent code records episodes) ---
    openai_served_model_name: str = Field(
        "",
        description="vLLM's --served-model-name: the model id /v1/models and completions report (any request's"
        " model reaches this policy); empty: the name of the engine's model directory.",
    )
    openai_conversation_idle_timeout_s: float = Field(
        600.0,
        gt=0,
        description="A conversation with no request for this long is abandoned (counted, never pushed); a group"
        " of conversations waiting this long for a member is pushed with its finished members.",
    )

    @model_validator(mode="after")
    def _model_reward_has_a_url(self) -> RolloutSettings:
        if self.reward_kind != "rule" and not self.reward_model_url:
            raise ValueError(
                f"reward_kind {self.reward_kind!r} needs reward_model_url"
                " (RELAYRL_ROLLOUT_REWARD_MODEL_URL): the reward service's base URL"
            )
        return self
