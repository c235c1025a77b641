"""verl's perf metrics: MFU by the 6·N·tokens count against a known peak (left out where no peak is
known, as on every CPU), throughput per device, and their Prometheus names."""

import pytest
import torch

from relayrl.metrics import key_to_metric_name
from services.trainer.perf import StepPerf, mfu, peak_flops


def test_mfu_is_six_flops_per_parameter_and_token_over_the_peak():
    # 1e9 parameters, 1e4 tokens in 0.5 s on 2 devices of 100 TFLOP/s: 6e13 / 1e14 = 0.6.
    assert mfu(1e4, 1e9, 0.5, 100e12, 2) == pytest.approx(0.6)
    assert mfu(1e4, 1e9, 0.5, None, 2) is None


def test_a_cpu_reports_mfu_only_against_a_peak_it_was_given():
    actor = torch.nn.Linear(10, 10)  # 110 parameters
    cpu = torch.device("cpu")
    assert peak_flops(cpu) is None
    plain = StepPerf.of(actor, cpu, devices=2, tflops=None).metrics(tokens=1000, train_s=2.0, update_actor_s=1.0)
    assert plain == {"perf/throughput": 250.0}  # tokens / s / device; no MFU, no GPU memory
    given = StepPerf.of(actor, cpu, devices=2, tflops=1e-6).metrics(tokens=1000, train_s=2.0, update_actor_s=1.0)
    assert given["perf/mfu/actor"] == pytest.approx(6 * 110 * 1000 / (1.0 * 1e6 * 2))


def test_the_perf_keys_keep_verls_names_in_prometheus():
    assert key_to_metric_name("trainer", "perf/mfu/actor") == "relayrl_trainer_perf_mfu_actor"
    assert key_to_metric_name("trainer", "perf/throughput") == "relayrl_trainer_perf_throughput"
    assert (
        key_to_metric_name("trainer", "perf/max_memory_allocated_gb") == "relayrl_trainer_perf_max_memory_allocated_gb"
    )
    assert key_to_metric_name("trainer", "timing_s/update_weights") == "relayrl_trainer_timing_s_update_weights"
