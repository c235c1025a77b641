from relayrl.stack.progress import ProgressLine


def test_a_resumed_run_counts_only_its_own_samples_per_second():
    # Resumed at t=1000 after 4_416 samples; 64 more samples 2 s later is 32 samples/s.
    line = ProgressLine(total_steps=8, started_at=1000.0, baseline_samples=4416.0)
    row = {"trainer/global_steps": 5, "trainer/processed_samples": 4480.0, "time": 1002.0}
    assert "32.0 samples/s" in line.render(row, None)
