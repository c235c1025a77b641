"""``relayrl.gpu_busy``: the busy fraction of a window from readings at a fixed period, with the reading
function given (NVML's own path runs under ``tests/gpu/stack``), and what a host without NVML says."""

from __future__ import annotations

import itertools
import sys
import threading

import pytest
import torch

from relayrl.extras import MissingExtra
from relayrl.gpu_busy import GpuBusyMeter, NvmlGpus, busy_fraction


def test_the_busy_fraction_is_the_mean_of_the_readings():
    assert busy_fraction([1.0, 0.0, 0.5, 0.5]) == 0.5
    assert busy_fraction([]) is None


def test_the_meter_averages_every_reading_of_its_window_over_the_gpus():
    taken: list[list[float]] = []
    enough = threading.Event()
    values = itertools.cycle([[1.0, 0.0], [0.9, 0.9], [0.2, 0.4]])

    def read() -> list[float]:
        taken.append(next(values))
        if len(taken) >= 4:
            enough.set()
        return taken[-1]

    meter = GpuBusyMeter(read, period_s=0.01)
    meter.start()
    assert enough.wait(10)
    busy = meter.stop()
    assert busy == pytest.approx(sum(sum(r) / 2 for r in taken) / len(taken))


def test_a_reading_that_fails_mid_window_leaves_the_window_without_a_figure(caplog):
    lost = threading.Event()
    taken: list[int] = []

    def read() -> list[float]:
        taken.append(1)
        if len(taken) == 3:
            lost.set()
            raise RuntimeError("NVML: GPU is lost")
        return [1.0]

    meter = GpuBusyMeter(read, period_s=0.01)
    meter.start()
    assert lost.wait(10)
    assert meter.stop() is None
    assert "GPU is lost" in caplog.text
    # The next window starts clean.
    meter.start()
    assert meter.stop() == 1.0


def test_the_meter_can_measure_a_second_window_on_its_own():
    level = [1.0]
    meter = GpuBusyMeter(lambda: level, period_s=0.01)
    meter.start()
    assert meter.stop() == 1.0
    level[0] = 0.25
    meter.start()
    assert meter.stop() == 0.25


def test_without_nvidia_ml_py_the_gpu_extra_is_named_in_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(MissingExtra) as err:
        NvmlGpus(["0"])
    message = str(err.value)
    assert "\n" not in message and "pip install 'relayrl[gpu]'" in message and "gpu_busy_fraction" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU driver: NVML opens")
def test_without_a_driver_nvml_says_why_in_one_line():
    pytest.importorskip("pynvml", reason="the gpu extra is not installed")
    with pytest.raises(RuntimeError, match=r"^NVML cannot read GPU\(s\) 0: ") as err:
        NvmlGpus(["0"])
    assert "\n" not in str(err.value)
