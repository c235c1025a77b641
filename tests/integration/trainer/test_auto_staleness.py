"""max_staleness auto in a running trainer (real queue and paramsync, the synthetic rollout): the
controller's decision governs admission at once, and every group trained stays within the η it was
admitted under."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from tests.integration.trainer.harness import Stack, start_trainer, stop_group

SMALL = dict(batch_size=2, n_samples=2, max_new_tokens=4, micro_batch_tokens=64, dataset_size=32, lr=1e-3)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_auto_raises_eta_to_its_limit_and_each_group_keeps_the_bound_it_was_admitted_under(
    redis_server, tiny_model_dir, tmp_path
):
    run_dir = tmp_path / "run"
    with Stack(redis_server.url, f"t{uuid.uuid4().hex[:6]}") as stack:
        env = stack.trainer_env(
            tiny_model_dir,
            run_dir,
            total_steps=8,
            save_freq=4,
            # Thresholds a waiting trainer always meets, and drift never does: η rises at every decision.
            staleness_initial=0,
            max_staleness_limit=2,
            staleness_adjust_every=1,
            staleness_idle_threshold=0.0,
            staleness_starved_share=0.0,
            staleness_max_abs_log_ratio=1e9,
            staleness_max_clipfrac=1.0,
            **SMALL,
        )
        env["RELAYRL_TRAINER_MAX_STALENESS"] = "auto"
        env["RELAYRL_MAX_STALENESS"] = "2"  # every other service's bound: the limit
        proc = start_trainer(env, tmp_path / "trainer.log")
        try:
            assert proc.wait(180) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
        finally:
            stop_group(proc)
    log = (tmp_path / "trainer.log").read_text()
    rows = [r for r in _lines(run_dir / "metrics.jsonl") if "trainer/global_steps" in r]
    # η in force at each step: 0 at first, one more after each decision, never above the limit.
    assert [r["staleness/eta"] for r in rows] == [0, 1, 2, 2, 2, 2, 2, 2]
    assert "max_staleness auto: η 0 → 1 after step 1" in log and "η 1 → 2 after step 2" in log
    trained = [line for line in _lines(run_dir / "groups.jsonl") if "ages" in line]
    pairs = [(age, eta) for line in trained for age, eta in zip(line["ages"], line["etas"], strict=True)]
    assert len(pairs) == 8 * SMALL["batch_size"]
    # Every group carried the η of its admission and was trained within it.
    assert all(eta is not None and 0 <= age <= eta <= 2 for age, eta in pairs), pairs
    # The first batch was admitted on-policy, later ones under the raised η.
    assert {eta for _, eta in pairs[: SMALL["batch_size"]]} == {0} and 2 in {eta for _, eta in pairs}
