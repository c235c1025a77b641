"""`relayrl replay`: a seeded run re-run from its trajectory log reproduces every checkpoint's weights
bit for bit on CPU, writes nothing into the run, and a run killed by SIGKILL is replayable up to the
last batch it consumed."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from services.trainer.trajectory_log import LOG_DIR, read_records
from tests.integration.trainer.harness import REPO, Stack, python_env, start_trainer, stop_group
from tests.waiting import wait_until

SMALL = dict(batch_size=2, n_samples=2, max_new_tokens=4, micro_batch_tokens=64, dataset_size=32, lr=1e-3)


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "commands.cli", "replay", *args]
    return subprocess.run(cmd, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=300)


def _kept(run_dir: Path) -> list[int]:
    """Steps of the finished checkpoints (a save under way is still a ``.partial-step_N``)."""
    return sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_a_run_killed_by_sigkill_replays_bit_for_bit_up_to_its_last_consumed_batch(
    redis_server, tiny_model_dir, tmp_path
):
    run_dir = tmp_path / "run"
    with Stack(redis_server.url, f"t{uuid.uuid4().hex[:6]}") as stack:
        env = stack.trainer_env(
            tiny_model_dir,
            run_dir,
            max_staleness=1,
            total_steps=200,
            save_freq=2,
            keep_checkpoints=2,
            trajectory_log_keep="all",
            seed=3,
            **SMALL,
        )
        proc = start_trainer(env, tmp_path / "trainer.log")
        try:
            # Checkpoints are written in the background, so five trained steps do not yet mean the
            # step-4 save has landed: wait for both kept saves before the kill.
            wait_until(
                lambda: len(_rows(run_dir)) >= 5 and len(_kept(run_dir)) >= 2,
                timeout_s=180,
                what="five trained steps and two finished checkpoints",
            )
            stop_group(proc, signal.SIGKILL)
        finally:
            stop_group(proc)
    assert proc.returncode == -signal.SIGKILL
    logged = read_records(run_dir / LOG_DIR)
    trained = {r["step"]: r for r in _rows(run_dir)}
    # Every batch taken is logged before it trains; the one under way at the kill may be too.
    assert [r.step for r in logged] == list(range(1, logged[-1].step + 1))
    assert logged[-1].step in (len(trained), len(trained) + 1)
    before = _tree(run_dir)

    extra = ("--extra-metrics", "entropy,ratios", "--dump-step", "3")
    done = _replay(str(run_dir), "--out", str(tmp_path / "replay"), *extra)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (report["from_step"], report["until_step"]) == (0, logged[-1].step)
    kept = _kept(run_dir)
    # keep_checkpoints=2, and a third while the kill lands between a save's switch and its pruning.
    assert [c["step"] for c in report["checkpoints"]] == kept and len(kept) in (2, 3)
    assert all(c["original"] == c["replayed"] for c in report["checkpoints"]), report["checkpoints"]
    assert _tree(run_dir) == before, "a replay wrote into the run directory"

    # The replay logged the same training as the original did, step by step.
    replayed = {r["step"]: r for r in _rows(tmp_path / "replay")}
    assert [replayed[s]["actor/pg_loss"] for s in trained] == [trained[s]["actor/pg_loss"] for s in trained]
    # The dump of step 3: one line per sample, per-token figures over each whole response.
    lines = [json.loads(x) for x in (tmp_path / "replay" / "step_00000003.tokens.jsonl").read_text().splitlines()]
    assert len(lines) == SMALL["batch_size"] * SMALL["n_samples"]
    for line in lines:
        n = len(line["response_token_ids"])
        assert n and len(line["entropy"]) == len(line["log_ratio"]) == len(line["logprob"]) == n
        assert all(e >= 0 for e in line["entropy"])
    assert "replay/token_entropy_mean" in replayed[3] and "replay/token_entropy_mean" not in replayed[2]

    # Bad input: a directory without a log stops with one line, and writes nothing.
    (tmp_path / "bare").mkdir()
    done = _replay(str(tmp_path / "bare"), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and not (tmp_path / "out").exists()
    assert done.stderr.strip().count("\n") == 0 and "no trajectory log" in done.stderr
