"""Trainer dashboard: verl's training metrics (losses, KL, entropy, grad norm, rewards) and timing.

The trainer exports each verl key as a gauge named by :func:`relayrl.metrics.key_to_metric_name`
(``actor/pg_loss`` → ``relayrl_trainer_actor_pg_loss``), holding the value of the last step.
Critic panels have data only with a value model (PPO with GAE); they share panels with the
actor's counterpart so every panel shows something under GRPO too.
"""

from __future__ import annotations

from observability.dashboards.common import Board, Query, timeseries_panel
from relayrl.metrics import key_to_metric_name

UID = "relayrl-trainer"


def verl(key: str, legend: str | None = None) -> Query:
    """The trainer's latest value of a verl key, across all trainer ranks that export it."""
    return Query(f"max({key_to_metric_name('trainer', key)})", legend or key)


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
        timeseries_panel(
            "Step time breakdown",
            "Seconds per step: waiting for trajectory groups, forward/backward, publishing weights, validation.",
            [
                verl("timing/wait_s", "wait for data"),
                verl("timing/forward_backward_s", "forward + backward"),
                verl("timing/publish_s", "publish"),
                verl("timing/validate_s", "validate"),
                verl("timing/step_s", "step total"),
            ],
            unit="s",
        ),
        timeseries_panel(
            "Idle ratio",
            "Share of each step spent waiting for trajectory groups; high means rollout is the bottleneck.",
            [verl("trainer/idle_ratio", "idle")],
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
        timeseries_panel(
            "Versions",
            "Policy version trained, and versions published to paramsync (verl's param_sync_count).",
            [
                verl("trainer/current_param_version"),
                verl("trainer/param_sync_count"),
                verl("trainer/param_sync_failures"),
            ],
        ),
        timeseries_panel(
            "Staleness of trained samples",
            "Age in policy versions of the samples in each batch (mean and max); never above η.",
            [verl("staleness/avg_sample_age", "mean"), verl("staleness/max_sample_age", "max")],
            min_value=0,
        ),
        timeseries_panel(
            "Dropped and skipped",
            "Groups the trainer dropped as stale, and steps skipped for an empty batch, since the start.",
            [verl("trainer/dropped_stale_groups"), verl("trainer/skipped_empty_batches")],
        ),
    )
    board.row("Losses").add(
        timeseries_panel(
            "Losses",
            "Policy-gradient loss, KL loss (with use_kl_loss) and value loss (with a critic).",
            [verl("actor/pg_loss"), verl("actor/kl_loss"), verl("critic/vf_loss")],
        ),
        timeseries_panel(
            "KL",
            "approx_kl: k3 estimate of KL(behaviour ‖ current); ppo_kl: mean log-ratio to the proximal policy.",
            [verl("actor/approx_kl"), verl("actor/ppo_kl")],
        ),
        timeseries_panel("Entropy", "Mean token entropy of the policy on the batch.", [verl("actor/entropy")]),
        timeseries_panel(
            "Clip fractions",
            "Fraction of tokens whose ratio was clipped (upper, lower/dual clip) and of clipped values.",
            [verl("actor/pg_clipfrac"), verl("actor/pg_clipfrac_lower"), verl("critic/vf_clipfrac")],
            unit="percentunit",
        ),
        timeseries_panel(
            "Gradient norm",
            "Global gradient norm before clipping; steps with a non-finite norm are skipped.",
            [verl("actor/grad_norm"), verl("critic/grad_norm"), verl("actor/nonfinite_grad_steps")],
        ),
        timeseries_panel("Learning rate", "Actor learning rate after the scheduler.", [verl("actor/lr")]),
    )
    board.row("Data").add(
        timeseries_panel(
            "Reward",
            "Mean sequence score and mean token-level reward of the batch.",
            [verl("critic/score/mean"), verl("critic/rewards/mean")],
        ),
        timeseries_panel(
            "Advantages and returns",
            "Mean advantage, and with a critic the mean return and the value model's explained variance.",
            [verl("critic/advantages/mean"), verl("critic/returns/mean"), verl("critic/vf_explained_var")],
        ),
        timeseries_panel(
            "Response length", "Mean response length of the batch, tokens.", [verl("response_length/mean")]
        ),
        timeseries_panel("Batch tokens", "Non-padding tokens in the step's batch.", [verl("trainer/batch_tokens")]),
        timeseries_panel(
            "Rollout–training mismatch",
            "Mean |p_rollout − p_train| and mean log-prob difference between the engine and the trainer.",
            [verl("training/rollout_probs_diff_mean"), verl("training/rollout_logprob_diff_mean")],
        ),
    )
    board.row("Recipes").add(
        timeseries_panel(
            "Mismatch KL",
            "KL(engine ‖ trainer) on sampled tokens, k1 and k3 estimates (set rollout_is_threshold to record).",
            [verl("mismatch/kl", "k1"), verl("mismatch/k3_kl", "k3")],
        ),
        timeseries_panel(
            "Mismatch ratio quantiles",
            "5th, 50th and 95th percentile of π_trainer/π_engine at rollout_is_level, and the mean weight applied.",
            [
                verl("mismatch/ratio_q05", "q05"),
                verl("mismatch/ratio_q50", "q50"),
                verl("mismatch/ratio_q95", "q95"),
                verl("mismatch/weight_mean", "mean weight"),
            ],
        ),
        timeseries_panel(
            "Tokens masked by mismatch correction",
            "Share of response tokens given weight 0 (outside [lower, upper] in mask mode, or vetoed).",
            [verl("mismatch/masked_frac", "masked")],
            unit="percentunit",
            min_value=0,
        ),
        timeseries_panel(
            "Dynamic sampling",
            "Groups dropped for want of signal before this step (all solved / all failed), and generation "
            "batches it took to fill the batch (filter_groups).",
            [
                verl("filter_groups/dropped_all_solved", "all solved"),
                verl("filter_groups/dropped_all_failed", "all failed"),
                verl("filter_groups/gen_batches_per_batch", "gen batches / batch"),
            ],
        ),
    )
    return board
