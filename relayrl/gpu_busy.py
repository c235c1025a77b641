"""How busy GPUs were over a window: NVML's utilization read at a fixed period in a thread.

NVML's ``nvmlDeviceGetUtilizationRates(handle).gpu`` is the percentage of its last sample period
(between 1/6 s and 1 s, by GPU) during which a kernel ran on the GPU. Read every ``period_s`` over
a window, the mean of the readings is the share of the window the GPU was busy
(``gpu_busy_fraction``); over several GPUs, the mean of theirs. The meter takes the reading
function as an argument, so its arithmetic does not care where readings come from;
:class:`NvmlGpus` is the one that reads NVML (``nvidia-ml-py``'s ``pynvml``, the ``gpu`` extra).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

# NVML refreshes utilization at most every 1/6 s: reading faster repeats the same sample.
DEFAULT_PERIOD_S = 0.2

# Busy share of each GPU, 0..1, at the moment of the call.
Reading = Callable[[], Sequence[float]]


class GpuBusyMeter:
    """Mean busy share of the GPUs ``read`` reports, between :meth:`start` and :meth:`stop`."""

    def __init__(self, read: Reading, period_s: float = DEFAULT_PERIOD_S) -> None:
        self._read = read
        self._period_s = period_s
        self._readings: list[float] = []
        self._failed: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._readings.clear()
        self._failed = None
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, name="gpu-busy", daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """The window's busy fraction; None when no reading fell in it, or a reading failed (logged):
        the readings before a failure cover only part of the window."""
        assert self._thread is not None, "stop() before start()"
        self._stop.set()
        self._thread.join()
        if self._failed is not None:
            log.warning("GPU busy fraction left out: a reading failed mid-window (%s)", self._failed)
            return None
        return busy_fraction(self._readings)

    def _sample(self) -> None:
        # The first reading comes at once, then one per period until stopped.
        while True:
            try:
                shares = self._read()
            except Exception as exc:  # an NVML error: nothing after it is read
                self._failed = exc
                return
            self._readings.append(sum(shares) / len(shares))
            if self._stop.wait(self._period_s):
                return


def busy_fraction(readings: Sequence[float]) -> float | None:
    """The mean of readings taken at a fixed period (each the GPUs' mean busy share), or None."""
    return sum(readings) / len(readings) if readings else None


class NvmlGpus:
    """NVML's view of ``gpus`` as ``CUDA_VISIBLE_DEVICES`` names them (PCI bus order indices, or UUIDs):
    their names, and, called, each one's busy share now (a :data:`Reading`).

    Raises :class:`~relayrl.extras.MissingExtra` naming the ``gpu`` extra where ``pynvml`` is not
    installed, and ``RuntimeError`` saying why where NVML cannot open them (no driver, no such GPU).
    """

    def __init__(self, gpus: Sequence[str]) -> None:
        from relayrl.extras import require

        self._nvml = nvml = require("pynvml", "gpu", "gpu_busy_fraction (NVML)")
        try:
            nvml.nvmlInit()
            self._handles = [
                nvml.nvmlDeviceGetHandleByUUID(gpu) if gpu.startswith(("GPU-", "MIG-")) else
                nvml.nvmlDeviceGetHandleByIndex(int(gpu))
                for gpu in gpus
            ]  # fmt: skip
            self.names = tuple(str(nvml.nvmlDeviceGetName(handle)) for handle in self._handles)
        except (nvml.NVMLError, ValueError) as exc:
            raise RuntimeError(f"NVML cannot read GPU(s) {', '.join(gpus)}: {exc}") from None

    def __call__(self) -> list[float]:
        return [self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0 for handle in self._handles]
