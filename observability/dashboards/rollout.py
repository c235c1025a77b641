"""Rollout dashboard: generation throughput, in-flight work, errors, weight version per replica,
tool use of multi-turn episodes, and the engine's own metrics.

Each rollout replica is its own scrape target, so series are told apart by ``instance``.
Engine panels read SGLang's ``sglang:*`` metrics (served with ``--enable-metrics``) and, where
the built-in CPU engine has an equivalent, fall back to its ``relayrl_engine_*`` series, so
the same dashboard works on GPUs and on a CPU machine.
"""

from __future__ import annotations

from observability.dashboards.common import Board, Query, timeseries_panel
from observability.dashboards.promql import (
    ROLLOUT_IDLE_BY_INSTANCE,
    counter_rate,
    latency_panel,
    per_instance,
    quantiles,
    rates_panel,
    total_rate,
)

UID = "relayrl-rollout"

# Panels fed only by SGLang: the built-in engine has no KV-cache pool to report, nor these latencies.
SGLANG_ONLY_PANELS = ("KV cache token usage", "Time to first token", "Request latency")
# The built-in engine's prompt tokens, of which those its prefix cache gave.
CACHED = '{source="cached"}'

# Panels fed only by multi-turn episodes (multi_turn_enable): a single-turn run has no data for them.
MULTI_TURN_PANELS = ("Tool calls by outcome", "Tool latency", "Turns per episode", "Episodes by end reason")


def build() -> Board:
    board = Board(UID, "RelayRL / Rollout", "Rollout replicas and their inference engines.", ["rollout"])
    board.row("Generation").add(
        timeseries_panel(
            "Tokens per second",
            "Response tokens generated per second, per replica.",
            [
                per_instance("sum", counter_rate("relayrl_rollout_generated_tokens_total")),
                total_rate("relayrl_rollout_generated_tokens_total", "all replicas"),
            ],
        ),
        timeseries_panel(
            "Samples per second",
            "Samples generated and scored per second, per replica (verl's total_generated_samples).",
            [per_instance("sum", counter_rate("relayrl_rollout_total_generated_samples_total"))],
        ),
        timeseries_panel(
            "In-flight requests",
            "Generation requests in flight from each replica to its engine.",
            [per_instance("sum", "relayrl_rollout_in_flight_requests")],
        ),
        timeseries_panel(
            "Idle ratio",
            "Share of the last 5 minutes each replica had no generation in flight: waiting on backpressure,"
            " the staleness bound, a weight switch or a pause.",
            [Query(ROLLOUT_IDLE_BY_INSTANCE, "{{instance}}")],
            unit="percentunit",
            min_value=0,
        ),
        rates_panel(
            "Errors and drops",
            "Per second: failed generations, failed reward calls and samples dropped before push for staleness.",
            {
                "generation errors": "relayrl_rollout_generation_errors_total",
                "reward errors": "relayrl_rollout_reward_errors_total",
                "dropped stale": "relayrl_rollout_dropped_stale_samples_total",
            },
        ),
        latency_panel(
            "Engine call latency",
            "Latency of one /generate call, all replicas.",
            "relayrl_rollout_engine_latency_seconds",
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
                per_instance("avg", "relayrl_rollout_reward_mean"),
                Query(
                    f"histogram_quantile(0.5, sum by (le) ({counter_rate('relayrl_rollout_reward_bucket')}))",
                    "median, all replicas",
                ),
            ],
        ),
        timeseries_panel(
            "Groups pushed",
            "Trajectory groups accepted by the queue per second, per replica.",
            [per_instance("sum", counter_rate("relayrl_rollout_pushed_groups_total"))],
            unit="ops",
        ),
    )
    board.row("Weights").add(
        timeseries_panel(
            "Weight version per replica",
            "Policy version each replica's engine holds, against the latest paramsync holds.",
            [
                per_instance("max", "relayrl_rollout_weight_version"),
                Query("max(relayrl_paramsync_latest_version)", "latest"),
            ],
        ),
        latency_panel(
            "Weight update duration",
            "From announcement to weights live in the engine (fetch + switch).",
            "relayrl_rollout_weight_update_duration_seconds",
        ),
        rates_panel(
            "Weight loads",
            "Versions the replicas tried to load, and those that failed, per second; of those loaded, how many"
            " by the trainer's handles (nothing fetched) and how many handle loads fell back to the bytes.",
            {
                "requests": "relayrl_rollout_param_sync_requests_total",
                "failures": "relayrl_rollout_param_sync_failures_total",
                "by handle": 'relayrl_rollout_versions_loaded_total{route="handles"}',
                "handle fallbacks": "relayrl_rollout_handle_fallbacks_total",
            },
        ),
        timeseries_panel(
            "Engine ready",
            "1 when the replica's engine answers /health.",
            [per_instance("min", "relayrl_rollout_engine_ready")],
            min_value=0,
        ),
    )
    board.row("Agents and tools").add(
        timeseries_panel(
            "Tool calls by outcome",
            "Tool calls per second in multi-turn episodes, by tool and outcome: ok, malformed, unknown_tool,"
            " error, timeout (tool is empty for calls that named no configured tool).",
            [
                Query(
                    f"sum by (tool, outcome) ({counter_rate('relayrl_rollout_tool_calls_total')})",
                    "{{tool}} {{outcome}}",
                )
            ],
            unit="ops",
            stacked=True,
        ),
        timeseries_panel(
            "Tool latency",
            "How long one tool call ran once it had a concurrency slot, by tool; timed-out calls count their"
            " timeout (multi_turn_tool_timeout_s).",
            quantiles("relayrl_rollout_tool_latency_seconds", by=("tool",), levels=(0.5, 0.95)),
            unit="s",
        ),
        timeseries_panel(
            "Turns per episode",
            "Model turns of each finished episode, all replicas.",
            quantiles("relayrl_rollout_episode_turns"),
        ),
        timeseries_panel(
            "Episodes by end reason",
            "Episodes ended per second: answer (a turn without a tool call), interaction (it ended the"
            " episode), max_turns, token_budget (max_new_tokens ran out).",
            [Query(f"sum by (reason) ({counter_rate('relayrl_rollout_episodes_total')})", "{{reason}}")],
            unit="ops",
            stacked=True,
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
            [per_instance("max", "sglang:token_usage")],
            unit="percentunit",
        ),
        timeseries_panel(
            "Prefix cache hit rate",
            "Share of prompt tokens whose keys and values came from the engine's prefix cache: SGLang's radix"
            " cache (sglang:cache_hit_rate) or the built-in engine's (relayrl_engine_prompt_tokens_total).",
            [
                Query(
                    "avg by (instance) (sglang:cache_hit_rate)"
                    f" or sum by (instance) ({counter_rate('relayrl_engine_prompt_tokens_total', CACHED)})"
                    f" / sum by (instance) ({counter_rate('relayrl_engine_prompt_tokens_total')})",
                    "{{instance}}",
                )
            ],
            unit="percentunit",
        ),
        latency_panel(
            "Time to first token",
            "SGLang only: time to first token (sglang:time_to_first_token_seconds).",
            "sglang:time_to_first_token_seconds",
        ),
        latency_panel(
            "Request latency",
            "SGLang only: end-to-end request latency inside the engine (sglang:e2e_request_latency_seconds).",
            "sglang:e2e_request_latency_seconds",
        ),
    )
    return board
