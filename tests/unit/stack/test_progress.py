from commands.stack.progress import ProgressLine


def test_a_resumed_run_counts_only_its_own_samples_per_second():
    # Resumed at t=1000 after 4_416 samples; 64 more samples 2 s later is 32 samples/s.
    line = ProgressLine(total_steps=8, started_at=1000.0, baseline_samples=4416.0)
    row = {"trainer/global_steps": 5, "trainer/processed_samples": 4480.0, "time": 1002.0}
    assert "32.0 samples/s" in line.render(row, None)


def test_the_validation_before_training_shows_the_held_out_score_not_a_reward():
    line = ProgressLine(total_steps=8, started_at=1000.0)
    row = {"trainer/global_steps": 0, "time": 1002.0, "val/test_score/relayrl/long_add": 0.25}
    assert line.render(row, None) == "step 0/8 | held-out score before training: long_add 0.250"
