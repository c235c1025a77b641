"""The trajectory log: what a killed, resumed or long run leaves in it, and what replay refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relayrl.schema import Group, Sample
from services.trainer.replay import ReplayError, plan_replay
from services.trainer.trajectory_log import CONFIG_FILE, LOG_DIR, TrajectoryLog, read_records, segments


def _group(gid: str, version: int) -> Group:
    return Group(gid, f"p/{gid}", [Sample([1, 2], [3, 4], [-0.25, -0.5], [version, version], reward=1.0)])


def _write(log: TrajectoryLog, steps: range) -> None:
    for step in steps:
        log.append(step, step - 1, [_group(f"g{step}a", step - 1), _group(f"g{step}b", step - 1)])


def _run(tmp_path: Path, steps: int, checkpoints: dict[int, list[str]] | None = None, keep_all: bool = True) -> Path:
    """A run directory as a trainer leaves it: the log, a checkpoint (its trainer state) every 2 steps."""
    run = tmp_path / "run"
    log = TrajectoryLog(run / LOG_DIR, fsync_every_step=False, keep_all=keep_all)
    log.write_config({"settings": {"model_dir": str(tmp_path / "model")}, "world_size": 1, "torch_threads": 1})
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text("{}")
    for step in range(1, steps + 1):
        _write(log, range(step, step + 1))
        if step % 2 == 0:
            ids = [f"g{s}{x}" for s in range(1, step + 1) for x in "ab"]
            if checkpoints is not None and step in checkpoints:
                ids = checkpoints[step]
            ckpt = run / "checkpoints" / f"step_{step:08d}"
            ckpt.mkdir(parents=True)
            (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "trained_group_ids": ids}))
            log.sync()
            log.checkpointed(min(int(p.name[5:]) for p in (run / "checkpoints").glob("step_*")))
    log.close()
    return run


def test_records_come_back_in_order_with_their_groups_and_versions(tmp_path):
    run = _run(tmp_path, 5)
    records = read_records(run / LOG_DIR)
    assert [(r.step, r.version, r.group_ids) for r in records] == [
        (s, s - 1, [f"g{s}a", f"g{s}b"]) for s in range(1, 6)
    ]
    group = records[2].groups()[1]
    assert group.group_id == "g3b" and group.samples[0].behavior_logprobs == [-0.25, -0.5]
    # A new segment after each checkpoint.
    assert [p.name for p in segments(run / LOG_DIR)] == [
        "segment_00000001.log",
        "segment_00000003.log",
        "segment_00000005.log",
    ]


def test_a_record_torn_by_a_kill_ends_the_log_and_a_resume_cuts_it_and_the_steps_after_the_checkpoint(tmp_path):
    run = _run(tmp_path, 5)
    last = segments(run / LOG_DIR)[-1]
    last.write_bytes(last.read_bytes() + b"RTL1\x40\x00")  # a kill in the middle of writing step 6
    assert read_records(run / LOG_DIR)[-1].step == 5

    # Resumed from the checkpoint of step 4: steps 5 (and the torn 6) trained weights the crash lost.
    log = TrajectoryLog(run / LOG_DIR, fsync_every_step=True, keep_all=True)
    log.resume_at(4)
    _write(log, range(5, 7))
    log.close()
    assert [r.step for r in read_records(run / LOG_DIR)] == [1, 2, 3, 4, 5, 6]


def test_the_log_is_bounded_by_the_checkpoints_kept(tmp_path):
    run = _run(tmp_path, 7, keep_all=False)
    # Checkpoints at 2, 4 and 6 all kept here: the oldest (2) needs steps 3 on.
    assert [r.step for r in read_records(run / LOG_DIR)] == [3, 4, 5, 6, 7]
    plan = plan_replay(run)
    assert plan.start_step == 2 and [r.step for r in plan.records] == [3, 4, 5, 6, 7]
    assert sorted(plan.checkpoints) == [4, 6]
    with pytest.raises(ReplayError, match="starts at step 3, not 1"):
        plan_replay(run, from_step=0)


def test_replay_refuses_a_log_that_does_not_match_its_checkpoints(tmp_path):
    run = _run(tmp_path, 4, checkpoints={4: ["g1a", "g1b", "g2a", "g2b", "g3a", "g3b", "g4b", "g4a"]})
    with pytest.raises(ReplayError, match="does not match checkpoint step_00000004"):
        plan_replay(run)


def test_replay_refuses_a_log_with_steps_missing_and_a_run_without_a_log(tmp_path):
    run = _run(tmp_path, 5)
    segments(run / LOG_DIR)[1].unlink()  # steps 3 and 4
    with pytest.raises(ReplayError, match=r"steps 3\.\.4 are missing"):
        plan_replay(run)
    (run / LOG_DIR / CONFIG_FILE).unlink()
    with pytest.raises(ReplayError, match="no trajectory log"):
        plan_replay(run)
    with pytest.raises(ReplayError, match="--until-step 9 is outside"):
        plan_replay(_run(tmp_path / "other", 3), until_step=9)
