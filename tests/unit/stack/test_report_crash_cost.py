"""The run report says what crashes cost the run: steps redone after resumes and their seconds."""

from commands.stack.report import build_report


def test_the_report_carries_the_trainers_crash_cost_from_its_last_row():
    rows = [
        {"trainer/global_steps": s, "critic/score/mean": 0.5, "time": 1000.0 + s, "trainer/redone_steps": redone,
         "trainer/redone_s": 4.0 * redone, "trainer/resumes_with_redone_steps": float(redone > 0)}
        for s, redone in ((1, 0.0), (2, 0.0), (3, 6.0), (4, 6.0))
    ]  # fmt: skip
    report = build_report("r", rows, "critic/score/mean", window=1, max_staleness=1, started_at=1000.0)
    assert report.crash_cost == {"redone_steps": 6.0, "redone_s": 24.0, "resumes_with_redone_steps": 1.0}


def test_a_run_from_before_the_crash_cost_metrics_reports_none():
    rows = [{"trainer/global_steps": 1, "critic/score/mean": 0.5, "time": 1001.0}]
    report = build_report("r", rows, "critic/score/mean", window=1, max_staleness=1, started_at=1000.0)
    assert report.crash_cost == {"redone_steps": 0.0, "redone_s": 0.0, "resumes_with_redone_steps": 0.0}
