"""The trainer's performance figures under verl's names, and the device calls they need.

- ``perf/throughput``: tokens (prompt + response, no padding) trained per second of the step's
  training (forward, backward, optimizer), per device, as verl divides by its GPU count.
- ``perf/mfu/actor``: 6 · N · tokens / (peak × seconds of the actor's update × devices), N every
  parameter of the actor (a LoRA actor's frozen base included: its backward still runs through
  them; tied embeddings once), attention's FLOPs left out: the count issue #46 fixes. verl's
  counter (its ``FlopsCounter``) counts the embeddings and the output head apart, tied or not, and
  adds attention's 12 · Σ seqlen² · head_dim · heads · layers: on Qwen2.5-0.5B it reads about 1.3×
  this. The peak is the
  device's dense bf16 peak (989 TFLOP/s for H100 and H200) or ``mfu_peak_tflops``; where neither
  is known (every CPU) the metric is left out rather than made up.
- ``perf/max_memory_allocated_gb``: the most memory torch's CUDA allocator held during the step,
  GiB (verl's unit); left out on CPU, which has no such counter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Dense bf16 peak, TFLOP/s, by device name fragment (the first that matches counts).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0}
GIB = 1024**3


def peak_flops(device: torch.device, tflops: float | None = None) -> float | None:
    """The device's dense bf16 peak in FLOP/s: ``tflops`` when given, else known by its name, else None."""
    if tflops is not None:
        return tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v * 1e12 for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def synchronize() -> None:
    """Waits for the GPU's queued work, so a clock read after it counts that work (nothing on CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def max_memory_allocated_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None


def mfu(tokens: float, params: float, seconds: float, peak: float | None, devices: int) -> float | None:
    """The share of ``devices`` × ``peak`` that 6 · ``params`` FLOPs per token over ``seconds`` used."""
    if peak is None or seconds <= 0:
        return None
    return 6.0 * params * tokens / (seconds * peak * devices)


@dataclass(frozen=True, slots=True)
class StepPerf:
    """What one trainer job needs to turn a step's tokens and times into verl's perf metrics."""

    device: torch.device
    params: int
    devices: int
    peak: float | None

    @classmethod
    def of(cls, actor: torch.nn.Module, device: torch.device, devices: int, tflops: float | None) -> StepPerf:
        # A DTensor's numel is the whole tensor's, so every rank counts the same N.
        return cls(device, sum(p.numel() for p in actor.parameters()), devices, peak_flops(device, tflops))

    def metrics(self, tokens: float, train_s: float, update_actor_s: float) -> dict[str, float]:
        out = {"perf/throughput": tokens / train_s / self.devices if train_s > 0 else 0.0}
        if (value := mfu(tokens, self.params, update_actor_s, self.peak, self.devices)) is not None:
            out["perf/mfu/actor"] = value
        if (memory := max_memory_allocated_gb(self.device)) is not None:
            out["perf/max_memory_allocated_gb"] = memory
        return out
