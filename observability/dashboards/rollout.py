"""Rollout dashboard: generation throughput, in-flight work, errors, weight version per replica,
and the engine's own metrics.

Each rollout replica is its own scrape target, so series are told apart by ``instance``.
Engine panels read SGLang's ``sglang:*`` metrics (served with ``--enable-metrics``) and, where
the built-in CPU engine has an equivalent, fall back to its ``relayrl_engine_*`` series, so
the same dashboard works on GPUs and on a CPU machine.
"""

from __future__ import annotations

from observability.dashboards.common import Board, Query, timeseries_panel
from observability.dashboards.promql import ROLLOUT_IDLE_BY_INSTANCE, counter_rate, quantiles

UID = "relayrl-rollout"

# Panels fed only by SGLang: the built-in engine has no KV-cache pool or prefix cache to report.
SGLANG_ONLY_PANELS = ("KV cache token usage", "Prefix cache hit rate", "Time to first token", "Request latency")


def build() -> Board:
    board = Board(UID, "RelayRL / Rollout", "Rollout replicas and their inference engines.", ["rollout"])
    board.row("Generation").add(
        timeseries_panel(
            "Tokens per second",
            "Response tokens generated per second, per replica.",
            [
                Query(f"sum by (instance) ({counter_rate('relayrl_rollout_generated_tokens_total')})", "{{instance}}"),
                Query(f"sum({counter_rate('relayrl_rollout_generated_tokens_total')})", "all replicas"),
            ],
        ),
        timeseries_panel(
            "Samples per second",
            "Samples generated and scored per second, per replica (verl's total_generated_samples).",
            [
                Query(
                    f"sum by (instance) ({counter_rate('relayrl_rollout_total_generated_samples_total')})",
                    "{{instance}}",
                )
            ],
        ),
        timeseries_panel(
            "In-flight requests",
            "Generation requests in flight from each replica to its engine.",
            [Query("sum by (instance) (relayrl_rollout_in_flight_requests)", "{{instance}}")],
        ),
        timeseries_panel(
            "Idle ratio",
            "Share of the last 5 minutes each replica had no generation in flight: waiting on backpressure,"
            " the staleness bound, a weight switch or a pause.",
            [Query(ROLLOUT_IDLE_BY_INSTANCE, "{{instance}}")],
            unit="percentunit",
            min_value=0,
        ),
        timeseries_panel(
            "Errors and drops",
            "Per second: failed generations, failed reward calls and samples dropped before push for staleness.",
            [
                Query(f"sum({counter_rate('relayrl_rollout_generation_errors_total')})", "generation errors"),
                Query(f"sum({counter_rate('relayrl_rollout_reward_errors_total')})", "reward errors"),
                Query(f"sum({counter_rate('relayrl_rollout_dropped_stale_samples_total')})", "dropped stale"),
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Engine call latency",
            "Latency of one /generate call, all replicas.",
            quantiles("relayrl_rollout_engine_latency_seconds"),
            unit="s",
        ),
        timeseries_panel(
            "Response length",
            "Tokens per response, all replicas.",
            quantiles("relayrl_rollout_response_length_tokens"),
        ),
        timeseries_panel(
            "Reward",
            "Mean reward of the last pushed group per replica, and the median over recent samples.",
            [
                Query("avg by (instance) (relayrl_rollout_reward_mean)", "{{instance}}"),
                Query(
                    f"histogram_quantile(0.5, sum by (le) ({counter_rate('relayrl_rollout_reward_bucket')}))",
                    "median, all replicas",
                ),
            ],
        ),
        timeseries_panel(
            "Groups pushed",
            "Trajectory groups accepted by the queue per second, per replica.",
            [Query(f"sum by (instance) ({counter_rate('relayrl_rollout_pushed_groups_total')})", "{{instance}}")],
            unit="ops",
        ),
    )
    board.row("Weights").add(
        timeseries_panel(
            "Weight version per replica",
            "Policy version each replica's engine holds, against the latest paramsync holds.",
            [
                Query("max by (instance) (relayrl_rollout_weight_version)", "{{instance}}"),
                Query("max(relayrl_paramsync_latest_version)", "latest"),
            ],
        ),
        timeseries_panel(
            "Weight update duration",
            "From announcement to weights live in the engine (fetch + switch).",
            quantiles("relayrl_rollout_weight_update_duration_seconds"),
            unit="s",
        ),
        timeseries_panel(
            "Weight loads",
            "Versions the replicas tried to load, and those that failed, per second.",
            [
                Query(f"sum({counter_rate('relayrl_rollout_param_sync_requests_total')})", "requests"),
                Query(f"sum({counter_rate('relayrl_rollout_param_sync_failures_total')})", "failures"),
            ],
            unit="ops",
        ),
        timeseries_panel(
            "Engine ready",
            "1 when the replica's engine answers /health.",
            [Query("min by (instance) (relayrl_rollout_engine_ready)", "{{instance}}")],
            min_value=0,
        ),
    )
    board.row("Engine").add(
        timeseries_panel(
            "Running requests",
            "Requests in the engine's running batch (sglang:num_running_reqs).",
            [
                Query(
                    "sum by (instance) (sglang:num_running_reqs)"
                    " or sum by (instance) (relayrl_engine_running_requests)",
                    "{{instance}}",
                )
            ],
        ),
        timeseries_panel(
            "Waiting requests",
            "Requests waiting for a batch slot (sglang:num_queue_reqs).",
            [
                Query(
                    "sum by (instance) (sglang:num_queue_reqs) or sum by (instance) (relayrl_engine_waiting_requests)",
                    "{{instance}}",
                )
            ],
        ),
        timeseries_panel(
            "Engine generation throughput",
            "Tokens per second decoded by each engine (sglang:gen_throughput).",
            [
                Query(
                    "sum by (instance) (sglang:gen_throughput)"
                    f" or sum by (instance) ({counter_rate('relayrl_engine_generated_tokens_total')})",
                    "{{instance}}",
                )
            ],
        ),
        timeseries_panel(
            "KV cache token usage",
            "SGLang only: fraction of the KV-cache token pool in use (sglang:token_usage).",
            [Query("max by (instance) (sglang:token_usage)", "{{instance}}")],
            unit="percentunit",
        ),
        timeseries_panel(
            "Prefix cache hit rate",
            "SGLang only: radix-cache hit rate of prompt tokens (sglang:cache_hit_rate).",
            [Query("avg by (instance) (sglang:cache_hit_rate)", "{{instance}}")],
            unit="percentunit",
        ),
        timeseries_panel(
            "Time to first token",
            "SGLang only: time to first token (sglang:time_to_first_token_seconds).",
            quantiles("sglang:time_to_first_token_seconds"),
            unit="s",
        ),
        timeseries_panel(
            "Request latency",
            "SGLang only: end-to-end request latency inside the engine (sglang:e2e_request_latency_seconds).",
            quantiles("sglang:e2e_request_latency_seconds"),
            unit="s",
        ),
    )
    return board
