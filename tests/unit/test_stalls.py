"""A wait on another service that stops moving is logged once and exported as seconds without progress."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge

from relayrl.stalls import StallWatch


def _watch(warn_after_s: float) -> tuple[StallWatch, CollectorRegistry]:
    registry = CollectorRegistry()
    gauge = Gauge("relayrl_test_stalled_seconds", "doc", ["waiting_for", "peer"], registry=registry)
    return StallWatch(gauge, warn_after_s, logging.getLogger("test.stalls")), registry


def _stalled(registry: CollectorRegistry, what: str, peer: str) -> float | None:
    return registry.get_sample_value("relayrl_test_stalled_seconds", {"waiting_for": what, "peer": peer})


def test_a_stalled_wait_logs_one_line_naming_what_and_whom(caplog: pytest.LogCaptureFixture) -> None:
    watch, _ = _watch(warn_after_s=0.05)
    with caplog.at_level(logging.INFO, "test.stalls"), watch.waiting("trajectory groups", "rollout") as wait:
        wait.tick()
        assert caplog.records == []  # not stalled yet
        time.sleep(0.06)  # the stall under test: no progress for longer than warn_after_s
        wait.tick()
        wait.tick()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "trajectory groups" in warnings[0] and "rollout" in warnings[0]
        wait.progress()
        assert "moved again" in caplog.records[-1].getMessage()


def test_the_gauge_reads_the_longest_wait_and_zero_once_nothing_waits() -> None:
    watch, registry = _watch(warn_after_s=60)
    assert _stalled(registry, "weights", "paramsync") is None
    with watch.waiting("weights", "paramsync") as old:
        time.sleep(0.05)  # the old wait ages before the new one starts: the gauge must read the older
        with watch.waiting("weights", "paramsync") as new:
            assert _stalled(registry, "weights", "paramsync") >= 0.05
            old.progress()
            assert _stalled(registry, "weights", "paramsync") < 0.05
            assert new.stalled_s() > 0
    assert _stalled(registry, "weights", "paramsync") == 0.0
