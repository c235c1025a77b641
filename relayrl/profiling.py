"""Where one stretch of work spends its time, from ``torch.profiler``: summed by kind and by name,
with how busy the device was; and what ``torch.compile`` has cost the process.

A bench that misses a speed target says why with it: on a GPU, ``busy_share`` is the share of
the stretch's wall time in which some kernel ran (the union of kernel intervals, so streams that
overlap count once); well below 1 the host or a synchronisation kept the GPU waiting, near 1 the
kernels themselves bound it, and ``by_kind`` and ``top`` say which. On a CPU the same summary
counts each operator's own CPU time (no busy share: the threads are the device).
"""

from __future__ import annotations

import gzip
import shutil
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")

# Substrings of a kernel's (or a CPU operator's) lowercased name, first match wins. Inductor's
# template kernels (triton_tem_*) are flex_attention's here (matmul templates need max-autotune,
# which nothing of RelayRL turns on), so attention comes before compiled code in general.
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("collective", ("nccl", "c10d::", "all_gather", "reduce_scatter", "allreduce")),
    ("attention", ("flex_attention", "flash", "fmha", "attention", "triton_tem", "_paged_decode")),
    ("matmul", ("gemm", "cutlass", "cublas", "nvjet", "xmma", "aten::mm", "aten::addmm", "aten::bmm", "matmul")),
    ("copy", ("memcpy", "memset", "aten::copy_", "aten::_to_copy", "copy_kernel")),
    ("compiled", ("triton_",)),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, needles in KINDS:
        if any(needle in lowered for needle in needles):
            return kind
    return "other"


@dataclass(frozen=True, slots=True)
class Span:
    """One kernel on the device (or one operator's own CPU time): its name, start and length in µs."""

    name: str
    start_us: float
    length_us: float


def busy_seconds(spans: Iterable[Span]) -> float:
    """Seconds in which at least one span ran: overlapping spans count once."""
    busy, end = 0.0, float("-inf")
    for span in sorted(spans, key=lambda s: s.start_us):
        stop = span.start_us + span.length_us
        if stop > end:
            busy += stop - max(span.start_us, end)
            end = stop
    return busy / 1e6


def summarize(spans: list[Span], wall_s: float, device: str, top: int = 12) -> dict[str, Any]:
    """The JSON a bench prints: total and busy seconds, seconds by kind, the ``top`` names by time."""
    by_name: dict[str, list[float]] = {}
    for span in spans:
        entry = by_name.setdefault(span.name, [0.0, 0])
        entry[0] += span.length_us / 1e6
        entry[1] += 1
    by_kind: dict[str, float] = {}
    for name, (seconds, _) in by_name.items():
        kind = kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    total = sum(seconds for seconds, _ in by_name.values())
    ranked = sorted(by_name.items(), key=lambda item: item[1][0], reverse=True)[:top]
    busy = busy_seconds(spans) if device == "cuda" else None
    return {
        "device": device,
        "wall_s": round(wall_s, 6),
        "total_s": round(total, 6),
        "busy_s": None if busy is None else round(busy, 6),
        "busy_share": None if busy is None or wall_s <= 0 else round(min(busy / wall_s, 1.0), 4),
        "by_kind": {kind: round(s, 6) for kind, s in sorted(by_kind.items(), key=lambda kv: kv[1], reverse=True)},
        "top": [
            {"name": name[:120], "kind": kind_of(name), "s": round(seconds, 6), "calls": int(calls)}
            for name, (seconds, calls) in ranked
        ],
    }


class Capture:
    """``torch.profiler`` started now and stopped by :meth:`stop`, on the thread that runs the work
    (a scheduler's loop profiles its own steps between two calls)."""

    def __init__(self, device: torch.device, activities: Collection[str] = ("CPU", "GPU")) -> None:
        from torch.profiler import ProfilerActivity

        self.device = device
        self.on_cuda = device.type == "cuda" and "GPU" in activities
        wanted = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if self.on_cuda else [])]
        self._prof = torch.profiler.profile(activities=wanted)
        self._prof.start()
        self._started = time.perf_counter()

    def stop(self, top: int = 12, trace: Path | None = None) -> dict[str, Any]:
        """Stops and returns :func:`summarize`'s JSON: on CUDA over the device's kernels and copies,
        on CPU over each operator's own time; ``trace`` also gets the Chrome trace (gzipped where
        its name ends in ``.gz``)."""
        from torch.autograd import DeviceType

        if self.on_cuda:
            torch.cuda.synchronize(self.device)
        wall_s = time.perf_counter() - self._started
        self._prof.stop()
        if trace is not None:
            _export(self._prof, trace)
        events = self._prof.events()
        if self.on_cuda:
            spans = [
                Span(e.name, e.time_range.start, e.time_range.elapsed_us())
                for e in events
                if e.device_type == DeviceType.CUDA
            ]
            if not spans:
                # CUPTI could not trace (another profiler holds it, or the host lacks it): no kernel
                # time is not an idle GPU, so no figure rather than a zero.
                return {"device": "cuda", "wall_s": round(wall_s, 6), "error": "the profiler saw no kernel"}
            return summarize(spans, wall_s, "cuda", top)
        spans = [Span(e.name, e.time_range.start, e.self_cpu_time_total) for e in events if e.self_cpu_time_total > 0]
        return summarize(spans, wall_s, "cpu", top)

    def cancel(self) -> None:
        """Stops without a summary (the work failed)."""
        self._prof.stop()


def _export(prof: Any, trace: Path) -> None:
    if trace.suffix != ".gz":
        prof.export_chrome_trace(str(trace))
        return
    plain = trace.with_suffix("")
    prof.export_chrome_trace(str(plain))
    with plain.open("rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def profile(work: Callable[[], T], device: torch.device, top: int = 12) -> tuple[T, dict[str, Any]]:
    """Runs ``work`` under ``torch.profiler`` and returns its value with :meth:`Capture.stop`'s JSON."""
    capture = Capture(device)
    try:
        value = work()
    except BaseException:
        capture.cancel()
        raise
    return value, capture.stop(top)


def compile_summary() -> dict[str, Any]:
    """What ``torch.compile`` has done in this process, from torch's own counters: graphs built,
    seconds compiling them (``seconds``), and of those the seconds waiting for their kernels to
    build (``kernels_s``). How much of a slow start is compilation, and whether serving or training
    compiles again after it (the graph count grows)."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    def total(phase: str) -> float:
        return round(sum(compilation_time_metrics.get(phase, [])), 3)

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "seconds": total("_compile.compile_inner"),
        "kernels_s": total("async_compile.wait"),
    }
