"""The rollout replica's Prometheus metrics, with verl's rollout names where verl has one."""

from __future__ import annotations

import time
from collections import deque

from relayrl.metrics import ServiceMetrics

# Response lengths in tokens.
_LENGTH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Model turns of one episode (verl's max_assistant_turns is usually single digits).
_TURN_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)


class RateWindow:
    """Events per second over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, float]] = deque()
        self._started = time.monotonic()

    def add(self, amount: float) -> None:
        self._events.append((time.monotonic(), amount))

    def rate(self) -> float:
        now = time.monotonic()
        while self._events and self._events[0][0] < now - self.window_s:
            self._events.popleft()
        span = min(self.window_s, max(now - self._started, 1e-3))
        return sum(a for _, a in self._events) / span


class RolloutMetrics:
    def __init__(self) -> None:
        self.registry = ServiceMetrics("rollout")
        m = self.registry
        self.total_generated_samples = m.counter("total_generated_samples", "Samples generated and scored.", "total")
        self.generation_errors = m.counter("generation_errors", "Prompts whose generation failed.", "total")
        self.dropped_stale_samples = m.counter(
            "dropped_stale_samples", "Samples dropped before pushing because they broke the staleness bound.", "total"
        )
        self.abandoned_leases = m.counter(
            "abandoned_leases",
            "Leases given back to the queue (group dropped as stale, generation failed, or taken by a lease call"
            " whose answer was lost), by reason.",
            "total",
            labels=("reason",),
        )
        self.stalled = m.gauge(
            "stalled",
            "Seconds the longest wait on another service has gone without progress (0: none waiting).",
            "seconds",
            labels=("waiting_for", "peer"),
        )
        self.param_sync_requests = m.counter(
            "param_sync_requests", "Weight versions the replica tried to load.", "total"
        )
        self.param_sync_failures = m.counter("param_sync_failures", "Weight versions that failed to load.", "total")
        self.versions_loaded = m.counter(
            "versions_loaded",
            "Weight versions loaded into the engine, by route: handles (the trainer's tensors opened on its host,"
            " nothing fetched) or bytes (fetched, or read from the announced directory). A distributed version"
            " is pushed by its sender and counted in neither.",
            "total",
            labels=("route",),
        )
        self.handle_fallbacks = m.counter(
            "handle_fallbacks",
            "Loads by handle given up for the version's bytes: the engine could not open the handles, or failed"
            " part way (then the bytes load before generation continues).",
            "total",
        )
        self.generation_paused = m.histogram(
            "generation_paused",
            "Seconds generation stood paused for one weight switch: pause to continue, or, where one update"
            " call aborts and applies between two engine steps, that call's whole time (an upper bound).",
        )
        self.weight_update_duration = m.histogram(
            "weight_update_duration", "Announcement to weights live in the engine (fetch + switch)."
        )
        self.weight_fetch = m.histogram(
            "weight_fetch", "Seconds to receive and verify one version from paramsync (generation goes on)."
        )
        self.weight_apply = m.histogram(
            "weight_apply", "Seconds the engine took to apply one version (the update call alone)."
        )
        self.weight_version = m.gauge("weight_version", "Policy version the engine holds.")
        self.validation_prompts = m.gauge(
            "validation_prompts", "Validation prompts in flight; training generation is held while any are."
        )
        self.held_for_validation = m.counter(
            "held_for_validation_seconds",
            "Seconds training prompts waited to start generating because validation prompts were in flight.",
            "total",
        )
        self.generated_tokens = m.counter("generated_tokens", "Response tokens generated.", "total")
        self.tokens_per_s = m.gauge("tokens_per_s", "Generated tokens per second over the last minute.")
        self.in_flight = m.gauge("in_flight_requests", "Generation requests in flight to the engine.")
        self.busy_seconds = m.counter(
            "generation_busy",
            "Seconds with at least one generation request in flight; 1 − its rate is the rollout idle ratio.",
            "seconds",
        )
        self.response_length = m.histogram(
            "response_length", "Response length of each sample.", unit="tokens", buckets=_LENGTH_BUCKETS
        )
        self.reward = m.histogram(
            "reward", "Reward of each sample.", unit="", buckets=(-1, -0.5, 0, 0.1, 0.25, 0.5, 0.75, 0.9, 1, 2)
        )
        self.reward_mean = m.gauge("reward_mean", "Mean reward of the last pushed group.")
        self.reward_errors = m.counter("reward_errors", "Reward calls that raised or timed out (reward 0).", "total")
        self.reward_service_latency = m.histogram(
            "reward_service_latency", "Seconds of one /score call to the reward service (one group)."
        )
        self.reward_service_errors = m.counter(
            "reward_service_errors",
            "Failed /score calls to the reward service, by kind: unavailable, timeout, rejected (4xx).",
            "total",
            labels=("kind",),
        )
        self.reward_service_up = m.gauge(
            "reward_service_up", "1 while the reward service scores; 0 after a group gave up on it, until /readyz."
        )
        self.engine_latency = m.histogram("engine_latency", "Latency of one /generate call.")
        self.engine_ready = m.gauge("engine_ready", "1 when the engine answers /health.")
        self.pushed_groups = m.counter("pushed_groups", "Trajectory groups accepted by the queue.", "total")
        self.tool_calls = m.counter(
            "tool_calls",
            "Tool calls the model wrote in multi-turn episodes, by tool and outcome: ok, malformed (not a JSON"
            " object with name and object arguments), unknown_tool, error (the tool raised or answered badly),"
            ' timeout. tool is a configured tool\'s name, "" when the call named none.',
            "total",
            labels=("tool", "outcome"),
        )
        self.tool_latency = m.histogram(
            "tool_latency",
            "Seconds one tool call ran (from getting a concurrency slot to its answer, error or timeout), by tool.",
            labels=("tool",),
        )
        self.episode_turns = m.histogram(
            "episode", "Model turns of each finished multi-turn episode.", unit="turns", buckets=_TURN_BUCKETS
        )
        self.episodes = m.counter(
            "episodes",
            "Multi-turn episodes that ended, by reason: answer (a turn without a tool call), interaction (the"
            " interaction ended it), max_turns, token_budget (no room for the next turn or observation).",
            "total",
            labels=("reason",),
        )
        self.token_rate = RateWindow()
        self.sample_rate = RateWindow()
