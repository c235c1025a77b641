"""Steps redone after a resume, read from metrics.jsonl rows (services.trainer.rollbacks)."""

from services.trainer.rollbacks import Redone, redone_steps, totals


def _row(step: int, step_s: float = 2.0, wait_s: float = 0.5) -> dict:
    return {"trainer/global_steps": step, "timing/step_s": step_s, "timing/wait_s": wait_s}


def test_a_step_written_again_marks_the_steps_after_the_checkpoint_as_redone():
    rows = [{"trainer/global_steps": 0}, *map(_row, range(1, 8)), *map(_row, range(6, 9))]
    # Killed after step 7, resumed from the checkpoint of step 5: steps 6 and 7 trained twice.
    assert redone_steps(rows) == [Redone(at_step=6, steps=2, seconds=3.0)]


def test_a_resume_under_way_counts_the_steps_past_its_checkpoint():
    rows = list(map(_row, range(1, 13)))
    assert redone_steps(rows, resumed_from=10) == [Redone(11, 2, 3.0)]
    assert redone_steps(rows, resumed_from=12) == []  # stopped right at a checkpoint: nothing redone


def test_totals_add_up_every_resume_of_the_run():
    rows = [*map(_row, range(1, 5)), *map(_row, range(3, 7)), *map(_row, range(5, 7))]
    assert totals(redone_steps(rows)) == {
        "trainer/redone_steps": 4.0,
        "trainer/redone_s": 6.0,
        "trainer/resumes_with_redone_steps": 2.0,
    }
