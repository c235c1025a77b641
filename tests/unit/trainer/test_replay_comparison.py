"""What `relayrl replay` holds replayed weights to: bit for bit where the arithmetic repeats (CPU;
CUDA with deterministic algorithms on the same GPU model and torch), else max_rel_diff within a
stated tolerance; and the differences it reports."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.replay import CUDA_TOLERANCE, comparison_for, weight_difference

H200 = "NVIDIA H200"


def _config(device: str, deterministic: bool, gpu: str = H200, version: str = "2.11.0") -> dict:
    return {
        "settings": {"device": device, "deterministic": deterministic},
        "device_name": gpu if device == "cuda" else "cpu",
        "torch_version": version,
        "deterministic_algorithms": deterministic,
    }


def test_cpu_and_deterministic_cuda_on_the_same_gpu_and_torch_compare_bit_for_bit():
    assert comparison_for(_config("cpu", False), "cpu", "2.11.0", None).mode == "bitwise"
    same = comparison_for(_config("cuda", True), H200, "2.11.0", None)
    assert same.mode == "bitwise" and same.report()["tolerance"] is None
    assert same.holds(equal=True, max_rel_diff=0.0) and not same.holds(equal=False, max_rel_diff=0.0)


@pytest.mark.parametrize(
    ("config", "gpu", "version", "why"),
    [
        (_config("cuda", False), H200, "2.11.0", "without deterministic algorithms"),
        (_config("cuda", True), "NVIDIA H100 80GB HBM3", "2.11.0", "replayed on NVIDIA H100"),
        (_config("cuda", True), H200, "2.13.0", "replayed with 2.13.0"),
    ],
)
def test_otherwise_cuda_compares_max_rel_diff_within_the_stated_tolerance(config, gpu, version, why):
    comparison = comparison_for(config, gpu, version, None)
    assert comparison.mode == "tolerance" and why in comparison.reason
    assert comparison.report()["tolerance"] == {"measure": "max_rel_diff", "value": CUDA_TOLERANCE}
    assert comparison.holds(equal=False, max_rel_diff=CUDA_TOLERANCE)
    assert not comparison.holds(equal=False, max_rel_diff=CUDA_TOLERANCE * 1.01)
    assert comparison_for(config, gpu, version, 0.05).report()["tolerance"]["value"] == 0.05


def test_a_setting_asked_for_but_not_in_force_does_not_earn_a_bitwise_comparison():
    config = _config("cuda", True) | {"deterministic_algorithms": False}
    assert comparison_for(config, H200, "2.11.0", None).mode == "tolerance"


def test_the_differences_are_the_largest_element_and_the_largest_relative_norm_of_a_tensor():
    original = {"a": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0, 0.0]), "n": torch.tensor([7])}
    replayed = {"a": torch.tensor([3.0, 4.5]), "b": torch.tensor([1.0, 0.001]), "n": torch.tensor([7])}
    max_abs, max_rel = weight_difference(original, replayed)
    assert max_abs == pytest.approx(0.5)
    assert max_rel == pytest.approx(0.5 / 5.0)  # a: ‖(0, 0.5)‖ / ‖(3, 4)‖
    assert weight_difference(original, original) == (0.0, 0.0)


def test_nan_or_a_zero_tensor_gone_nonzero_is_infinitely_apart():
    zero = {"z": torch.zeros(3)}
    assert weight_difference(zero, {"z": torch.tensor([0.0, 1e-9, 0.0])})[1] == math.inf
    nan = weight_difference({"w": torch.ones(2)}, {"w": torch.tensor([1.0, float("nan")])})
    assert nan == (math.inf, math.inf)
