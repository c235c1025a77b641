"""The live progress line of a run, read from the trainer's ``metrics.jsonl``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from commands.stack.report import VALIDATION_PREFIX
from relayrl import http_client

REWARD_KEY = "critic/score/mean"


class MetricsTail:
    """Reads the rows appended to ``metrics.jsonl`` since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.rows: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open() as f:
            f.seek(self._offset)
            chunk = f.read()
        # Keep a partly written last line for the next poll.
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode())
        new = [json.loads(line) for line in complete.splitlines() if line.strip()]
        self.rows.extend(new)
        return new


def scrape(base_url: str, family: str) -> float | None:
    """The sum of a metric family's samples on a service's ``/metrics``; None when unreachable or absent.

    ``family`` is the name without a counter's ``_total`` suffix, as the Prometheus parser names it.
    """
    try:
        text = http_client.get(f"{base_url}/metrics", timeout=2.0).text
    except httpx.HTTPError:
        return None
    for parsed in text_string_to_metric_families(text):
        if parsed.name == family:
            return sum(s.value for s in parsed.samples if not s.name.endswith("_created"))
    return None


def read_samples(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Every sample on a service's ``/metrics`` by name, summed over labels (``..._sum``,
    ``..._count``, a counter's ``..._total``), for figures that must not silently read as zero:
    raises when the service does not answer."""
    try:
        text = http_client.get(f"{base_url}/metrics", timeout=timeout_s).raise_for_status().text
    except httpx.HTTPError as exc:
        raise RuntimeError(f"could not read {base_url}/metrics: {exc!r}") from exc
    samples: dict[str, float] = {}
    for parsed in text_string_to_metric_families(text):
        for sample in parsed.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def queue_depth(queue_http: str) -> float | None:
    """Groups waiting in the trajectory queue."""
    return scrape(queue_http, "relayrl_queue_queue_size_groups")


@dataclass
class ProgressLine:
    total_steps: int
    started_at: float
    # Samples processed before this session started (a resumed run): not part of its rate.
    baseline_samples: float = 0.0

    def render(self, row: dict[str, Any] | None, depth: float | None) -> str:
        if row is None:
            return "waiting for the first training step..."
        step = int(row.get("trainer/global_steps", 0))
        if step == 0:  # the validation before training
            held_out = ", ".join(
                f"{k.rsplit('/', 1)[-1]} {v:.3f}" for k, v in row.items() if k.startswith(VALIDATION_PREFIX)
            )
            return f"step 0/{self.total_steps} | held-out score before training: {held_out or 'none'}"
        wall = max(float(row.get("time", self.started_at)) - self.started_at, 1e-9)
        samples = float(row.get("trainer/processed_samples", 0.0)) - self.baseline_samples
        parts = [
            f"step {step}/{self.total_steps}",
            f"reward {row.get(REWARD_KEY, float('nan')):.3f}",
            f"staleness avg {row.get('staleness/avg_sample_age', 0.0):.2f}"
            f" max {row.get('staleness/max_sample_age', 0):.0f}",
            f"{samples / wall:.1f} samples/s",
            f"version {int(row.get('trainer/current_param_version', 0))}",
        ]
        if depth is not None:
            parts.append(f"queue {depth:.0f}")
        return " | ".join(parts)
