"""Trainer settings, read from ``RELAYRL_TRAINER_<FIELD>`` (and ``RELAYRL_MAX_STALENESS``).

Names follow verl where verl has one (``adv_estimator``, ``clip_ratio_c``,
``loss_agg_mode``, ``kl_loss_type``, ``entropy_coeff``, ``cliprange_value``); the
off-policy variant is ROLL's ``pg_variant``. No torch import here, so ``--help`` is instant.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from relayrl.config import ServiceSettings

AdvEstimator = Literal["grpo", "rloo", "reinforce_plus_plus", "gae"]
PgVariant = Literal["vanilla", "decoupled", "tis", "cispo", "topr", "kimi15"]
RolloutIsLevel = Literal["token", "sequence", "geometric"]
RolloutIsMode = Literal["truncate", "mask"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]
LrSchedulerType = Literal["constant", "cosine"]
KlType = Literal["k1", "k2", "k3"]
LoggerBackend = Literal["console", "tensorboard", "wandb"]
AdamBeta = Annotated[float, Field(ge=0, lt=1)]
# peft's shorthand for every linear layer but the output head; verl's default target_modules.
ALL_LINEAR = "all-linear"


def _listed(text: str) -> list[str]:
    """The items of a list the environment gives as ``[a, b]`` or ``a,b``, each without its spaces."""
    return [item.strip() for item in text.strip().removeprefix("[").removesuffix("]").split(",")]


def _pair_from_text(value: Any) -> Any:
    return _listed(value) if isinstance(value, str) else value


# AdamW's betas, for the trainer and `relayrl sft`. NoDecode and the validator: the environment may
# also give the two numbers separated by a comma, which is not JSON.
AdamBetas = Annotated[tuple[AdamBeta, AdamBeta], NoDecode, BeforeValidator(_pair_from_text)]


class TrainerSettings(ServiceSettings):
    """Everything one training run needs; every rank of a torchrun job reads the same values."""

    service_name: ClassVar[str] = "trainer"
    former_names: ClassVar[dict[str, str]] = {
        "micro_batch_tokens": "ppo_max_token_len_per_gpu",
        "checkpoint_every": "save_freq",
    }

    # --- run and links ---------------------------------------------------------------
    model_dir: Path = Field(Path("model"), description="Hugging Face causal LM directory: version 0 of the policy.")
    run_dir: Path | None = Field(
        None, description="Where checkpoints and metrics.jsonl go; default runs/<run_id> in the working directory."
    )
    queue_address: str = Field("127.0.0.1:50051", description="host:port of the queue service (gRPC).")
    paramsync_address: str = Field(
        "", description="host:port of paramsync (gRPC); empty gathers weights but publishes nowhere (benchmarks)."
    )
    sync_timeout: float = Field(
        300.0,
        gt=0,
        description="verl's name: seconds one exchange of an upload with paramsync may take (one bucket sent, the"
        " commit) before the attempt fails, naming the stage, paramsync's address and the version.",
    )
    max_sync_retries: int = Field(
        3,
        ge=0,
        description="verl's name: retries of an upload whose link failed, each resuming from the bucket in hand.",
    )
    sync_retry_delay: float = Field(
        1.0, ge=0, description="verl's name: seconds before the first retry of an upload, doubling after each."
    )
    consumer: str = Field(
        "trainer-0", description="Consumer name in the queue; a restarted trainer gets its own un-acked entries back."
    )
    # RELAYRL_TRAINER_MAX_STALENESS first: with auto, the trainer alone takes "auto" while every other
    # service reads the shared RELAYRL_MAX_STALENESS, set to max_staleness_limit (their loosest bound).
    max_staleness: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        1,
        description="η: a group trained at version v was started by a policy of version >= v − η (0 = on-policy);"
        " auto: the trainer picks η in [0, max_staleness_limit] as it goes (docs/auto-staleness.md). verl's"
        " staleness_threshold, AReaL's max_head_offpolicyness. Read from RELAYRL_TRAINER_MAX_STALENESS, else"
        " RELAYRL_MAX_STALENESS.",
        validation_alias=AliasChoices("RELAYRL_TRAINER_MAX_STALENESS", "RELAYRL_MAX_STALENESS", "max_staleness"),
    )
    max_staleness_limit: int = Field(
        4, ge=0, description="max_staleness auto: the highest η the controller may pick (also the rollout's bound)."
    )
    staleness_initial: int = Field(1, ge=0, description="max_staleness auto: η of the first steps.")
    staleness_adjust_every: int = Field(
        5, ge=1, description="max_staleness auto: steps measured between two decisions (raise, hold or lower η)."
    )
    staleness_idle_threshold: float = Field(
        0.05,
        ge=0,
        le=1,
        description="max_staleness auto: raise η while the trainer's mean idle share (trainer/idle_ratio) is above"
        " this and the rollout could take more work than was admitted.",
    )
    staleness_starved_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="max_staleness auto: the rollout counts as able to take more work when, in at least this share"
        " of the steps the trainer waited, the prompt queue had nothing left to lease.",
    )
    staleness_max_abs_log_ratio: float = Field(
        0.2,
        gt=0,
        description="max_staleness auto: lower η when the mean |log π_prox − log π_behav| over the window is above"
        " this (0.2: the mean token's ratio leaves verl's default clip range of ±0.2).",
    )
    staleness_max_clipfrac: float = Field(
        0.2,
        gt=0,
        le=1,
        description="max_staleness auto: lower η when the window's mean clipped share (actor/pg_clipfrac) is above"
        " this.",
    )
    trajectory_log: bool = Field(
        True,
        description="Write trajectories/ in the run directory: every group trained on, in order, with its versions,"
        " so `relayrl replay` can re-run the training without engine or queue (docs/replay.md).",
    )
    trajectory_log_keep: Literal["checkpoints", "all"] = Field(
        "checkpoints",
        description="checkpoints: keep the log from the oldest checkpoint kept on (bounded like keep_checkpoints);"
        " all: from step 1, so the whole run replays from the model directory.",
    )
    trajectory_log_fsync: Literal["checkpoint", "step"] = Field(
        "checkpoint",
        description="Each step's record reaches the OS at once (a killed trainer loses none); checkpoint: fsynced"
        " before each checkpoint becomes durable (no checkpoint outlives the log after a power loss); step: every"
        " record fsynced.",
    )
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu (gloo) or cuda (NCCL).")
    param_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto",
        description="Dtype FSDP2 gathers parameters in and computes with (verl's fsdp_config.mixed_precision."
        "param_dtype); master weights, gradient reduction, the optimizer and log-probs stay fp32. auto: bf16 on "
        "cuda, fp32 on cpu. bf16 on cpu is fast only where the CPU has native bf16 (AVX512-BF16 or AMX).",
    )
    rollout_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="Dtype a published version carries (verl's actor_rollout_ref.rollout.dtype): the engine's"
        " weight dtype (SGLang's --dtype, the engine's RELAYRL_ENGINE_DTYPE), so the engine loads the bytes as"
        " sent. Each bucket is cast where it was gathered (the GPU on cuda) before its copy to host memory;"
        " bf16 halves what travels. auto: bf16 on cuda, fp32 on cpu, as the engine's own auto; set it when the"
        " engine's dtype differs from that (a CPU trainer feeding a GPU engine, say). The master weights and"
        " checkpoints stay fp32.",
    )
    deterministic: bool = Field(
        False,
        description="torchtitan's name: torch's deterministic algorithms (use_deterministic_algorithms, raising on"
        " an op that has none; CUBLAS_WORKSPACE_CONFIG=:4096:8), set before CUDA starts, so `relayrl replay`"
        " of a CUDA run reproduces its checkpoints bit for bit (docs/replay.md). Costs some speed on a GPU;"
        " a CPU run is deterministic without it.",
    )
    seed: int = Field(0, description="Seed of data shuffling and of torch.")

    # --- data ----------------------------------------------------------------------------
    dataset: str = Field(
        "builtin:copy",
        description="Training prompts: a verl parquet/jsonl file, or builtin:<task> (a name in relayrl.tasks.TASKS).",
    )
    prompt_source: Literal["dataset", "agents"] = Field(
        "dataset",
        description="'dataset': release the dataset's prompts for the rollouts to generate; 'agents': agent-only"
        " training, nothing is released and the trainer trains on the groups agents push through the rollouts'"
        " OpenAI endpoint (the stack sets it from rollout.source; see docs/agent-only.md).",
    )
    dataset_size: int = Field(256, ge=1, description="Rows generated for a builtin dataset.")
    dataset_difficulty: int = Field(2, ge=1, description="Difficulty (digits) of a builtin dataset.")
    val_dataset: str = Field(
        "", description="Held-out prompts (same formats); empty uses the builtin task's val split, or none for files."
    )
    val_size: int = Field(16, ge=0, description="Rows of the held-out split used per validation.")
    max_prompt_tokens: int = Field(512, ge=1, description="Prompts longer than this are skipped (counted).")

    # --- generation requests (stamped on released prompts) ------------------------------
    n_samples: int = Field(4, ge=1, description="Samples per prompt (verl rollout.n); GRPO's group size.")
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature; log-probs are recomputed from logits / temperature."
    )
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling for training prompts.")
    max_new_tokens: int = Field(16, ge=1, description="Response length limit per sample.")

    # --- schedule --------------------------------------------------------------------------
    total_steps: int = Field(100, ge=1, description="Training steps (batches) of the run.")
    batch_size: int = Field(4, ge=1, description="Prompt groups per training step (verl train_batch_size).")
    ppo_mini_batches: int = Field(
        1, ge=1, description="Optimizer updates per batch (verl ppo_mini_batch_size = batch/this)."
    )
    use_dynamic_bsz: bool = Field(
        True,
        description="Micro-batches by a token budget (ppo_max_token_len_per_gpu), sequences of similar length"
        " together; false: ppo_micro_batch_size_per_gpu sequences each.",
    )
    ppo_max_token_len_per_gpu: int = Field(
        4096, ge=16, description="Token budget (prompt+response, padded) per micro-batch (use_dynamic_bsz)."
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=16,
        description="Deprecated: former name of ppo_max_token_len_per_gpu; when set, it is that budget (with a"
        " warning).",
    )
    ppo_micro_batch_size_per_gpu: int = Field(
        8, ge=1, description="Sequences per micro-batch when use_dynamic_bsz is false."
    )
    use_remove_padding: bool | None = Field(
        None,
        description="verl's name: each micro-batch's sequences go one after another in one row, positions"
        " restarting at each, attention confined to each (no padding; ppo_max_token_len_per_gpu then counts real"
        " tokens); false pads every sequence to the longest of its micro-batch. Unset: on with cuda, off with cpu,"
        " where sdpa confines attention with a dense mask as long as the row squared (short samples, as in the"
        " demo's, train several times slower packed than padded).",
    )
    attn_implementation: Literal["auto", "sdpa", "flex_attention", "eager"] = Field(
        "auto",
        description="verl's override_config.attn_implementation (transformers' name): auto is flex_attention on cuda"
        " (its document mask skips the blocks between packed sequences) and sdpa on cpu, where torch's"
        " flex_attention has no backward.",
    )
    enable_gradient_checkpointing: bool = Field(
        False,
        description="verl's name: keep only each decoder block's input for the backward and run the block again"
        " there: less activation memory (longer micro-batches fit) for about a third more compute.",
    )
    use_torch_compile: bool = Field(
        False,
        description="verl's name: compile each decoder block with torch.compile (inductor). The trainer compiles at"
        " start, while the rollout generates the first batch; worth it on GPUs, rarely on CPUs.",
    )
    mfu_peak_tflops: float | None = Field(
        None,
        gt=0,
        description="Dense bf16 peak of one device, TFLOP/s, for perf/mfu/actor; unset takes it from the GPU's name"
        " (989 for H100 and H200) and leaves MFU out where it is unknown (every CPU).",
    )
    recompute_old_log_prob: Literal["auto", "always"] = Field(
        "auto",
        description="auto: skip the no-grad forward for the proximal (old) log-probs when one mini-batch makes the"
        " update's own forward exactly that policy (verl's on_policy rule) and no in-reward KL needs them first;"
        " always: run it every step.",
    )
    sync_every: int = Field(1, ge=1, description="Publish a new policy version every this many steps.")
    update_weights_bucket_megabytes: int = Field(
        64,
        ge=1,
        description="verl's name: a publish gathers full tensors this many MiB at a time (a larger tensor in row"
        " ranges of at most this size) and uploads each bucket while the next is gathered, so rank 0 holds at"
        " most two buckets beyond its shard, never a second copy"
        " of the model. verl uses 512 on GPUs; 64 keeps the CPU trainer's peak low and measured as fast as 512"
        " for the small preset (services/trainer/README.md).",
    )
    share_weights_by_handle: bool = Field(
        False,
        description="Also share each published version by handle with engines on this host (CUDA IPC where"
        " trainer and engine share a GPU; slime's colocated weight update): rank 0 keeps the version in two"
        " slots of its own device memory (two copies of the model in the rollout dtype) and paramsync announces"
        " handles to it with the version, which the replica passes to its engine's /update_weights_from_tensor"
        " (SGLang's route): one device-to-device copy instead of a round trip through host memory. The bytes"
        " still go to paramsync for replicas elsewhere. Full weights only (not with LoRA).",
    )
    save_freq: int = Field(
        8,
        ge=1,
        description="verl's name: checkpoint every this many steps; must be a multiple of sync_every (see resume)."
        " A trainer that crashes redoes at most this many steps, plus with async_save those trained while the next"
        " checkpoint was still being written (one or two), and the groups generated by the versions it rolls back"
        " over are dropped (docs/crash-cost.md).",
    )
    checkpoint_every: int | None = Field(
        None, ge=1, description="Deprecated: former name of save_freq; when set, it is save_freq (with a warning)."
    )
    async_save: bool = Field(
        True,
        description="verl's and Megatron's name: the step loop only stages a host copy of each checkpoint, and a"
        " background thread writes it; queue entries are acknowledged once it is durable. False writes in the loop.",
    )
    test_freq: int = Field(
        0, ge=0, description="Validate every this many steps (verl's trainer.test_freq); 0 disables validation."
    )
    val_before_train: bool = Field(
        False,
        description="Also validate the starting policy before the first step, logged at step 0 (verl's"
        " trainer.val_before_train; off by default here, as a fresh run's random policy scores 0).",
    )
    eval_timeout_s: float = Field(300.0, gt=0, description="Longest wait for validation groups.")
    pull_timeout_s: float = Field(1.0, gt=0, description="Longest block of one queue pull.")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (the newest ones).")
    save_hf_model: bool = Field(
        False,
        description="Every checkpoint also holds hf/: the policy as a Hugging Face directory (config, safetensors,"
        " tokenizer, generation config), what `relayrl export` writes for that step.",
    )

    # --- LoRA (verl actor_rollout_ref.model.lora_rank / lora_alpha / target_modules) -------
    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA rank (verl lora_rank); 0 trains every weight. Above 0 only the adapter trains, each"
        " published version is the adapter alone, and the KL reference is the model with the adapter off.",
    )
    lora_alpha: float = Field(
        16.0, gt=0, description="LoRA alpha (verl lora_alpha): the adapter's update is scaled by alpha / rank."
    )
    # NoDecode: the validator below takes JSON, names separated by commas, or peft's all-linear.
    target_modules: Annotated[list[str] | str, NoDecode] = Field(
        ALL_LINEAR,
        description="Modules that get an adapter (verl target_modules): all-linear (every linear layer but the"
        ' output head), or module names such as ["q_proj","v_proj"] (in the environment also q_proj,v_proj).',
    )

    # --- experiment tracking (verl trainer.logger / project_name / experiment_name) -------
    # NoDecode: the validator below parses the variable itself, which takes more spellings than JSON.
    logger: Annotated[list[LoggerBackend], NoDecode] = Field(
        ["console"],
        description="Where training metrics go besides metrics.jsonl and Prometheus, which are always written:"
        " console (the progress line `relayrl up` prints from metrics.jsonl; the trainer adds nothing),"
        " tensorboard (event files in <run_dir>/tensorboard/), wandb (Weights & Biases; offline unless"
        ' WANDB_API_KEY is set or WANDB_MODE says otherwise). In the environment: ["console","tensorboard"]'
        " or console,tensorboard.",
    )
    project_name: str = Field("relayrl", min_length=1, description="wandb project (verl trainer.project_name).")
    experiment_name: str = Field(
        "", description="wandb run name (verl trainer.experiment_name); empty uses the run id."
    )

    # --- optimisation ----------------------------------------------------------------------
    lr: float = Field(1e-5, gt=0, description="Actor learning rate (AdamW).")
    critic_lr: float = Field(1e-5, gt=0, description="Critic learning rate (PPO with gae).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_eps: float = Field(
        1e-8,
        gt=0,
        description="AdamW's eps (torchtitan's optimizer.eps; PPO implementations use 1e-5). A weight moves by about "
        "lr × g / (|g| + eps): at torch's 1e-8 a gradient of 1e-6 moves it as far as one of 1, so once rewards stop "
        "differing within groups, the remaining near-zero gradient (an entropy bonus, noise) still moves every "
        "weight by lr each step; a larger eps lets such steps shrink with their gradient.",
    )
    adam_betas: AdamBetas = Field(
        (0.9, 0.999),
        description="AdamW's betas (verl optim.betas; OpenRLHF's --adam_betas): the running means of the gradient"
        " and of its square each average over about 1/(1 - beta) recent steps, 10 and 1,000 at torch's defaults,"
        " 10 and 20 at OpenRLHF's 0.9,0.95. In the environment: [0.9,0.95] or 0.9,0.95.",
    )
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    lr_scheduler_type: LrSchedulerType = Field(
        "constant",
        description="verl optim.lr_scheduler_type: after the warm-up the rate stays at lr (constant) or decays"
        " along a half cosine to min_lr_ratio × lr at total_steps (cosine).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="verl optim.min_lr_ratio: the cosine schedule's last rate, as a share of lr."
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")

    # --- algorithm -------------------------------------------------------------------------
    adv_estimator: AdvEstimator = Field(
        "grpo", description="grpo, rloo, reinforce_plus_plus, or gae (PPO, adds a critic)."
    )
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group's std (False = Dr. GRPO).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (gae, reinforce_plus_plus).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ.")
    pg_variant: PgVariant = Field(
        "decoupled",
        description="vanilla: PPO clip vs the proximal (recomputed) policy; decoupled: the same times the behaviour→"
        "proximal weight truncated at is_cap; tis: truncated-IS policy gradient vs the behaviour policy; cispo: "
        "clipped-IS-weight policy gradient vs the behaviour policy; topr: ROLL's tapered off-policy REINFORCE; "
        "kimi15: Kimi k1.5's policy gradient with a squared log-ratio penalty (ROLL's kimi15).",
    )
    clip_ratio_low: float = Field(0.2, ge=0, description="PPO ε below 1 (verl clip_ratio_low).")
    clip_ratio_high: float = Field(0.2, ge=0, description="PPO ε above 1 (verl clip_ratio_high).")
    clip_ratio_c: float = Field(3.0, gt=1, description="Dual-clip bound for negative advantages (verl clip_ratio_c).")
    is_cap: float = Field(2.0, gt=0, description="Truncation of importance weights (decoupled and tis).")
    cispo_eps_low: float = Field(1.0, ge=0, description="CISPO: weights clipped below at 1 − this.")
    cispo_eps_high: float = Field(0.28, ge=0, description="CISPO: weights clipped above at 1 + this.")
    loss_agg_mode: LossAggMode = Field("token-mean", description="How token losses become one number.")
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    use_kl_loss: bool = Field(False, description="Add a KL(actor‖reference) loss term (needs the reference model).")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss.")
    kl_loss_type: KlType = Field("k3", description="KL estimator of the loss: k1, k2 or k3 (low-variance).")
    use_kl_in_reward: bool = Field(False, description="Subtract kl_coef × KL(actor‖reference) from token rewards.")
    kl_coef: float = Field(0.001, ge=0, description="Weight of the in-reward KL penalty.")
    kl_penalty: KlType = Field("k1", description="KL estimator of the in-reward penalty.")
    cliprange_value: float = Field(0.5, gt=0, description="Critic value clipping around the old values.")

    # --- recipe: DAPO dynamic sampling (verl algorithm.filter_groups.*) ---
    filter_groups_enable: bool = Field(
        False,
        description="verl filter_groups.enable: drop groups whose samples all share one filter_groups_metric value "
        "(no GRPO signal) and release replacement prompts until a batch is full of informative groups.",
    )
    filter_groups_metric: str = Field(
        "score",
        description="verl filter_groups.metric: score, seq_reward, or a reward_extra key such as acc or raw_score.",
    )
    max_num_gen_batches: int = Field(
        0,
        ge=0,
        description="verl filter_groups.max_num_gen_batches: fail when filling one batch takes more than this many "
        "batches' worth of groups (the data is too easy or too hard); 0 = no limit.",
    )

    overlong_filter: bool = Field(
        False,
        description="DAPO's overlong filtering: responses cut at the length budget (finish_reason length) get no "
        "policy loss; they still count in their group's advantage baseline and in the loss normaliser.",
    )

    # --- recipes: ROLL's topr / kimi15 and train–inference mismatch correction (verl names) ---
    topr_positive_weight: float = Field(
        1.0, ge=0, description="TOPR (ROLL topr_positive_weight): weight of sequences with score > 0 (no IS weight)."
    )
    topr_negative_weight: float = Field(
        1.0,
        ge=0,
        description="TOPR (ROLL topr_negative_weight): weight of sequences with score <= 0, tapered by clip(ρ, 0, 1).",
    )
    kimi15_tau: float = Field(0.1, ge=0, description="Kimi k1.5 (ROLL kimi15_tau): τ of the τ/2·(log π/π_behav)² term.")
    use_rollout_log_probs: bool = Field(
        False,
        description="verl actor.use_rollout_log_probs (its rollout_correction bypass_mode): PPO's ratio is taken"
        " against the engine's log-probs, the policy that sampled, instead of the trainer's own before this step."
        " With one update per batch the clip then acts whenever a sample is older than the trainer's policy: a"
        " token whose probability already moved past 1 ± clip_ratio since it was sampled gets no gradient pushing"
        " it further. vanilla/decoupled only, and not with rollout_is (the ratio already is π/π_behav).",
    )
    rollout_is: bool = Field(
        False,
        description="verl algorithm.rollout_is: weight the policy loss by π_prox/π_behav (mismatch correction); "
        "False still logs the mismatch metrics when rollout_is_threshold is set.",
    )
    rollout_is_threshold: float | None = Field(
        None, gt=0, description="verl rollout_is_threshold: upper bound of the weight; unset disables correction."
    )
    rollout_is_threshold_lower: float | None = Field(
        None, gt=0, description="verl rollout_is_threshold_lower: lower bound in mask mode; unset = 1/upper."
    )
    rollout_is_level: RolloutIsLevel = Field(
        "token", description="verl rollout_is_level: token, sequence (product) or geometric (geometric mean)."
    )
    rollout_is_mode: RolloutIsMode = Field(
        "truncate",
        description="verl rollout_is_mode: truncate (cap at the upper bound) or mask (weight 0 outside [lower, upper]; "
        "token level = IcePop).",
    )
    rollout_is_veto_threshold: float | None = Field(
        None,
        gt=0,
        description="verl rollout_is_veto_threshold: a sequence with a token ratio below this gets weight 0.",
    )

    @field_validator("logger", mode="before")
    @classmethod
    def _logger_list(cls, value: Any) -> Any:
        # The environment gives a string: JSON (what `relayrl up` and the chart write), verl's
        # ['console','wandb'], or names separated by commas; verl also accepts one bare name.
        if isinstance(value, str):
            return [name.strip("'\"") for name in _listed(value) if name]
        return value

    @field_validator("target_modules", mode="before")
    @classmethod
    def _target_modules(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() != ALL_LINEAR:
            if value.strip().startswith("["):
                return json.loads(value)
            return [name.strip() for name in value.split(",") if name.strip()]
        return value.strip() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> TrainerSettings:
        if self.checkpoint_every is not None:
            self.save_freq = self.checkpoint_every
        if self.save_freq % self.sync_every:
            # A checkpoint must hold exactly the weights of a published version, so a resumed
            # trainer can re-publish that version with identical content.
            name = "save_freq" if self.checkpoint_every is None else "checkpoint_every"
            raise ValueError(f"{name} ({self.save_freq}) must be a multiple of sync_every ({self.sync_every})")
        if self.auto_staleness and self.staleness_initial > self.max_staleness_limit:
            raise ValueError(
                f"staleness_initial ({self.staleness_initial}) must be <= max_staleness_limit"
                f" ({self.max_staleness_limit})"
            )
        if self.rollout_is and self.rollout_is_threshold is None:
            raise ValueError("rollout_is needs rollout_is_threshold (RELAYRL_TRAINER_ROLLOUT_IS_THRESHOLD)")
        if self.use_rollout_log_probs and self.rollout_is:
            raise ValueError(
                "use_rollout_log_probs already takes PPO's ratio against the engine's log-probs; set rollout_is false"
            )
        if self.use_rollout_log_probs and self.pg_variant not in ("vanilla", "decoupled"):
            raise ValueError(
                f"use_rollout_log_probs applies to pg_variant vanilla/decoupled; {self.pg_variant} already takes its"
                " ratio against the engine's log-probs"
            )
        if self.rollout_is and self.pg_variant not in ("vanilla", "decoupled"):
            raise ValueError(
                f"rollout_is applies to pg_variant vanilla/decoupled; {self.pg_variant} already weights by π/π_behav"
            )
        return self

    @model_validator(mode="after")
    def _micro_batch_tokens_alias(self) -> TrainerSettings:
        if self.micro_batch_tokens is not None:
            # model_validate runs this twice, the second time with the value set here already: only
            # another value is a conflict.
            both = "ppo_max_token_len_per_gpu" in self.model_fields_set
            if both and self.ppo_max_token_len_per_gpu != self.micro_batch_tokens:
                raise ValueError("set ppo_max_token_len_per_gpu or its former name micro_batch_tokens, not both")
            self.ppo_max_token_len_per_gpu = self.micro_batch_tokens
        return self

    @property
    def bf16_compute(self) -> bool:
        """Whether FSDP2 gathers and computes in bf16: ``param_dtype``, ``auto`` resolved by the device."""
        return self.param_dtype == "bf16" or (self.param_dtype == "auto" and self.device == "cuda")

    @property
    def resolved_rollout_dtype(self) -> str:
        """``rollout_dtype`` as a torch dtype name, ``auto`` resolved by the device."""
        names = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
        if self.rollout_dtype == "auto":
            return "bfloat16" if self.device == "cuda" else "float32"
        return names[self.rollout_dtype]

    @property
    def auto_staleness(self) -> bool:
        return self.max_staleness == "auto"

    @property
    def initial_staleness(self) -> int:
        """η of the first step: the fixed bound, or auto's starting point."""
        return self.staleness_initial if self.max_staleness == "auto" else self.max_staleness

    @property
    def resolved_attn_implementation(self) -> str:
        """``attn_implementation`` with ``auto`` resolved by the device."""
        if self.attn_implementation != "auto":
            return self.attn_implementation
        return "flex_attention" if self.device == "cuda" else "sdpa"

    @property
    def resolved_use_remove_padding(self) -> bool:
        """``use_remove_padding``, unset resolved by the device."""
        return self.device == "cuda" if self.use_remove_padding is None else self.use_remove_padding

    @property
    def needs_reference(self) -> bool:
        return self.use_kl_loss or self.use_kl_in_reward

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def needs_critic(self) -> bool:
        return self.adv_estimator == "gae"

    def resolved_run_dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else Path("runs") / self.run_id
