"""Trainer dashboard: verl's training metrics (losses, KL, entropy, grad norm, rewards) and timing.

The trainer exports each verl key as a gauge named by :func:`relayrl.metrics.key_to_metric_name`
(``actor/pg_loss`` → ``relayrl_trainer_actor_pg_loss``), holding the value of the last step.
Critic panels have data only with a value model (PPO with GAE); they share panels with the
actor's counterpart so every panel shows something under GRPO too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grafana_foundation_sdk.builders import timeseries

from observability.dashboards.common import Board, Query, timeseries_panel
from relayrl.metrics import key_to_metric_name

UID = "relayrl-trainer"
# Panels fed only by a trainer on CUDA (perf/mfu/actor needs the device's peak, the allocator's peak
# is CUDA's): on a CPU stack they evaluate but have no data.
GPU_ONLY_PANELS = ("MFU", "Peak device memory")


def verl(key: str, legend: str | None = None) -> Query:
    """The trainer's latest value of a verl key, across all trainer ranks that export it."""
    return Query(f"max({key_to_metric_name('trainer', key)})", legend or key)


def verl_panel(
    title: str, description: str, keys: Sequence[str] | Mapping[str, str], **options: Any
) -> timeseries.Panel:
    """A panel of verl keys: a list (each legended by its key) or key → legend."""
    legends = keys if isinstance(keys, Mapping) else {key: key for key in keys}
    return timeseries_panel(title, description, [verl(key, legend) for key, legend in legends.items()], **options)


def build() -> Board:
    board = Board(UID, "RelayRL / Trainer", "FSDP2 policy training under verl's metric names.", ["trainer"])
    board.row("Progress").add(
        timeseries_panel(
            "Step rate",
            "Optimizer steps per minute (verl's global_steps).",
            [
                Query(
                    f"sum(rate({key_to_metric_name('trainer', 'trainer/global_steps')}[$__rate_interval])) * 60",
                    "steps/min",
                )
            ],
        ),
        verl_panel(
            "Step time breakdown",
            "Seconds per step: waiting for trajectory groups, forward/backward, publishing weights, validation.",
            {
                "timing/wait_s": "wait for data",
                "timing/forward_backward_s": "forward + backward",
                "timing/publish_s": "publish",
                "timing/validate_s": "validate",
                "timing/step_s": "step total",
            },
            unit="s",
        ),
        verl_panel(
            "Idle ratio",
            "Share of each step spent waiting for trajectory groups; high means rollout is the bottleneck.",
            {"trainer/idle_ratio": "idle"},
            unit="percentunit",
            min_value=0,
        ),
        timeseries_panel(
            "Throughput",
            "Trained tokens per second of compute, and samples per second processed.",
            [
                verl("perf/tokens_per_s", "tokens/s"),
                Query(
                    f"sum(rate({key_to_metric_name('trainer', 'trainer/processed_samples')}[$__rate_interval]))",
                    "samples/s",
                ),
            ],
        ),
        verl_panel(
            "Versions",
            "Policy version trained, and versions published to paramsync (verl's param_sync_count).",
            ["trainer/current_param_version", "trainer/param_sync_count", "trainer/param_sync_failures"],
        ),
        verl_panel(
            "Staleness of trained samples",
            "Age in policy versions of the samples in each batch (mean and max); never above η.",
            {"staleness/avg_sample_age": "mean", "staleness/max_sample_age": "max"},
            min_value=0,
        ),
        verl_panel(
            "Staleness bound η",
            "η new prompts are admitted under: fixed, or chosen by max_staleness auto from the trainer's idle"
            " share, the prompts left to lease and the off-policy drift (mean |log ratio|); docs/auto-staleness.md.",
            {
                "staleness/eta": "η",
                "trainer/idle_ratio": "idle share",
                "staleness/admission_starved": "waits with nothing to lease",
                "training/rollout_logprob_abs_diff_mean": "mean |log ratio|",
            },
            min_value=0,
        ),
        verl_panel(
            "Dropped and skipped",
            "Groups the trainer dropped as stale, and steps skipped for an empty batch, since the start.",
            ["trainer/dropped_stale_groups", "trainer/skipped_empty_batches"],
        ),
        timeseries_panel(
            "Crash cost",
            "Steps trained after a checkpoint that a resume redid, over the run (at most save_freq per crash), and"
            " groups the queue dropped as started by the versions a resume rolled back over (docs/crash-cost.md).",
            [
                verl("trainer/redone_steps", "steps redone"),
                verl("trainer/resumes_with_redone_steps", "resumes"),
                Query('sum(relayrl_queue_dropped_samples_groups{reason="rolled_back"})', "groups rolled back"),
            ],
            min_value=0,
        ),
    )
    board.row("Losses").add(
        verl_panel(
            "Losses",
            "Policy-gradient loss, KL loss (with use_kl_loss) and value loss (with a critic).",
            ["actor/pg_loss", "actor/kl_loss", "critic/vf_loss"],
        ),
        verl_panel(
            "KL",
            "approx_kl: k3 estimate of KL(behaviour ‖ current); ppo_kl: mean log-ratio to the proximal policy.",
            ["actor/approx_kl", "actor/ppo_kl"],
        ),
        verl_panel("Entropy", "Mean token entropy of the policy on the batch.", ["actor/entropy"]),
        verl_panel(
            "Clip fractions",
            "Fraction of tokens whose ratio was clipped (upper, lower/dual clip) and of clipped values.",
            ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"],
            unit="percentunit",
        ),
        verl_panel(
            "Gradient norm",
            "Global gradient norm before clipping; steps with a non-finite norm are skipped.",
            ["actor/grad_norm", "critic/grad_norm", "actor/nonfinite_grad_steps"],
        ),
        verl_panel("Learning rate", "Actor learning rate after the scheduler.", ["actor/lr"]),
    )
    board.row("Data").add(
        verl_panel(
            "Reward",
            "Mean sequence score and mean token-level reward of the batch.",
            ["critic/score/mean", "critic/rewards/mean"],
        ),
        verl_panel(
            "Advantages and returns",
            "Mean advantage, and with a critic the mean return and the value model's explained variance.",
            ["critic/advantages/mean", "critic/returns/mean", "critic/vf_explained_var"],
        ),
        verl_panel(
            "Groups without signal",
            "Share of the batch's groups whose samples all scored alike, so GRPO learns nothing from them, split"
            " into all solved (alike above 0) and all failed (alike at 0 or below). Most groups alike and many"
            " failed whole: the run has stalled (one answer to every prompt).",
            ["batch/no_signal_frac", "batch/all_solved_frac", "batch/all_failed_frac"],
            unit="percentunit",
        ),
        verl_panel("Response length", "Mean response length of the batch, tokens.", ["response_length/mean"]),
        verl_panel("Batch tokens", "Non-padding tokens in the step's batch.", ["trainer/batch_tokens"]),
        verl_panel(
            "Rollout–training mismatch",
            "Mean |p_rollout − p_train| and mean log-prob difference between the engine and the trainer.",
            ["training/rollout_probs_diff_mean", "training/rollout_logprob_diff_mean"],
        ),
        verl_panel(
            "Length bias",
            "Share of response tokens in the longest 10 % of answers: among those generated (the queue's window),"
            " among those trained this step and over the run. Trained below generated: long answers are lost.",
            {
                "length_bias/generated_long_share": "generated",
                "length_bias/trained_long_share": "trained (step)",
                "length_bias/trained_long_share_run": "trained (run)",
            },
            unit="percentunit",
            min_value=0,
        ),
    )
    board.row("Recipes").add(
        verl_panel(
            "Mismatch KL",
            "KL(engine ‖ trainer) on sampled tokens, k1 and k3 estimates (set rollout_is_threshold to record).",
            {"mismatch/kl": "k1", "mismatch/k3_kl": "k3"},
        ),
        verl_panel(
            "Mismatch ratio quantiles",
            "5th, 50th and 95th percentile of π_trainer/π_engine at rollout_is_level, and the mean weight applied.",
            {
                "mismatch/ratio_q05": "q05",
                "mismatch/ratio_q50": "q50",
                "mismatch/ratio_q95": "q95",
                "mismatch/weight_mean": "mean weight",
            },
        ),
        verl_panel(
            "Tokens masked by mismatch correction",
            "Share of response tokens given weight 0 (outside [lower, upper] in mask mode, or vetoed).",
            {"mismatch/masked_frac": "masked"},
            unit="percentunit",
            min_value=0,
        ),
        verl_panel(
            "Dynamic sampling",
            "Groups dropped for want of signal before this step (all solved / all failed), and generation "
            "batches it took to fill the batch (filter_groups).",
            {
                "filter_groups/dropped_all_solved": "all solved",
                "filter_groups/dropped_all_failed": "all failed",
                "filter_groups/gen_batches_per_batch": "gen batches / batch",
            },
        ),
    )
    board.row("Efficiency").add(
        verl_panel(
            "MFU",
            "perf/mfu/actor: 6 · parameters · tokens over the actor update's time, as a share of the devices' dense"
            " bf16 peak (989 TFLOP/s on H100 and H200; mfu_peak_tflops elsewhere; absent on CPU).",
            {"perf/mfu/actor": "actor"},
            unit="percentunit",
            min_value=0,
        ),
        verl_panel(
            "Throughput per device",
            "perf/throughput: prompt and response tokens trained per second of training, per device (no padding).",
            {"perf/throughput": "tokens/s per device"},
            min_value=0,
        ),
        verl_panel(
            "Peak device memory",
            "perf/max_memory_allocated_gb: the most GPU memory torch held during the step, GiB (absent on CPU).",
            {"perf/max_memory_allocated_gb": "max allocated"},
            unit="gbytes",
            min_value=0,
        ),
        verl_panel(
            "Weight update",
            "timing_s/update_weights: seconds training paid for publishing a version (the bucketed gather and its"
            " copy to host memory; the upload runs beside training).",
            {"timing_s/update_weights": "update_weights"},
            unit="s",
            min_value=0,
        ),
    )
    return board
