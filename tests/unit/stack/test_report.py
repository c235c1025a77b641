import json

import pytest

from commands.stack.report import build_report, plot_reward, read_metrics, validation_series


def _rows(rewards):
    return [
        {"trainer/global_steps": i + 1, "critic/score/mean": r, "time": 1000.0 + 2.0 * (i + 1),
         "trainer/processed_samples": 8 * (i + 1), "staleness/max_sample_age": i % 3}
        for i, r in enumerate(rewards)
    ]  # fmt: skip


def test_first_and_last_are_window_means():
    report = build_report(
        "r", _rows([0.0, 0.2, 0.4, 0.6, 0.8, 1.0]), "critic/score/mean", window=2, max_staleness=2, started_at=1000.0
    )
    assert report.reward_first == pytest.approx(0.1)
    assert report.reward_last == pytest.approx(0.9)
    assert report.reward_rise == pytest.approx(0.8)
    assert report.steps == 6 and report.samples_per_s == pytest.approx(4.0)
    assert report.max_sample_age == 2


def test_window_shrinks_to_half_the_run():
    report = build_report("r", _rows([0.0, 1.0]), "critic/score/mean", window=50, max_staleness=0, started_at=1000.0)
    assert report.window == 1 and report.reward_rise == 1.0


def test_no_steps_is_a_clear_error():
    with pytest.raises(ValueError, match="no training steps"):
        build_report("r", [{"val/test_score/x": 1}], "critic/score/mean", window=5, max_staleness=1, started_at=0.0)


def test_torn_last_line_is_skipped_and_plot_is_written(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows([0.1, 0.5])) + '\n{"trainer/glob')
    rows = read_metrics(path)
    assert len(rows) == 2
    png = plot_reward(rows, "critic/score/mean", 1000.0, tmp_path / "reward.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_held_out_scores_are_reported_and_plotted_beside_the_training_reward(tmp_path):
    # Step 0: the validation before training, a row without a training reward.
    rows = [{"trainer/global_steps": 0, "time": 1001.0, "val/test_score/relayrl/copy": 0.1}, *_rows([0.1, 0.2, 0.3])]
    rows[2]["val/test_score/relayrl/copy"] = 0.25
    rows[3]["val/test_score/relayrl/copy"] = 0.75
    report = build_report("r", rows, "critic/score/mean", window=1, max_staleness=1, started_at=1000.0)
    assert report.steps == 3
    assert (report.val_first, report.val_last) == (
        {"val/test_score/relayrl/copy": 0.1},
        {"val/test_score/relayrl/copy": 0.75},
    )
    points = [(0, 1.0, 0.1), (2, 4.0, 0.25), (3, 6.0, 0.75)]
    assert validation_series(rows, started_at=1000.0) == {"val/test_score/relayrl/copy": points}
    with_val = plot_reward(rows, "critic/score/mean", 1000.0, tmp_path / "with.png").read_bytes()
    plain = [{k: v for k, v in r.items() if not k.startswith("val/")} for r in rows]
    without = plot_reward(plain, "critic/score/mean", 1000.0, tmp_path / "without.png").read_bytes()
    assert with_val != without


def test_a_resumed_runs_report_covers_its_own_span():
    # Steps 1-6 ran before (times 1002-1012); the resume from step 4 redid 5-6 and went on to 8.
    earlier = _rows([0.1] * 6)
    resumed = [{**row, "time": 2000.0 + 2.0 * (row["trainer/global_steps"] - 4)} for row in _rows([0.5] * 8)[4:]]
    report = build_report(
        "r", earlier + resumed, "critic/score/mean", window=1, max_staleness=1, started_at=2000.0, resumed_from_step=4
    )
    assert (report.steps, report.resumed_from_step, report.span_steps) == (8, 4, 4)
    assert report.wall_s == pytest.approx(8.0)
    assert report.samples_per_s == pytest.approx(4 * 8 / 8.0), "only the span's samples, over the span's time"


def _with_signal(rows, no_signal, all_failed):
    return [{**r, "batch/no_signal_frac": no_signal, "batch/all_failed_frac": all_failed} for r in rows]


def test_a_run_that_ends_giving_one_answer_to_every_prompt_is_called_stalled():
    # Every group alike, half of them failed whole: what a policy blind to its prompt leaves.
    stuck = build_report(
        "r", _with_signal(_rows([0.5] * 4), 1.0, 0.5), "critic/score/mean", window=2, max_staleness=1, started_at=1000.0
    )
    assert stuck.no_signal_last == 1.0 and stuck.all_failed_last == 0.5
    assert stuck.stall_note() is not None and "1.00 of the groups scored alike" in stuck.stall_note()
    # A run that learned its task also ends with groups alike, but none failed whole.
    learned = build_report(
        "r", _with_signal(_rows([1.0] * 4), 1.0, 0.0), "critic/score/mean", window=2, max_staleness=1, started_at=1000.0
    )
    assert learned.stall_note() is None
    learning = build_report(
        "r", _with_signal(_rows([0.5] * 4), 0.3, 0.3), "critic/score/mean", window=2, max_staleness=1, started_at=1000.0
    )
    assert learning.stall_note() is None
    # A trainer that did not record the shares says nothing either way.
    assert build_report("r", _rows([0.5] * 4), "critic/score/mean", 2, 1, 1000.0).stall_note() is None
