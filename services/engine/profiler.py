"""SGLang's ``/start_profile`` and ``/stop_profile`` for the built-in engine: ``torch.profiler`` over
the scheduler's forward passes, on the scheduler's thread.

As SGLang does, a request may name where the files go (``output_dir``, else
``torch_profiler_dir``), how many forward passes to profile (``num_steps``, then it stops by
itself; without it ``/stop_profile`` ends it), from which forward pass on (``start_step``, counted
as ``/get_model_info``'s ``num_forward_passes``) and what to record (``activities``: ``CPU``,
``GPU``). It writes the Chrome trace as SGLang names it, ``<id>-TP-0.trace.json.gz``, and beside
it ``<id>-TP-0.summary.json``: where the time went, by kind of kernel, with the device's busy share
(:mod:`relayrl.profiling`), so a question like "what bounds decode on this GPU" needs no trace viewer.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from relayrl.profiling import Capture

log = logging.getLogger(__name__)

ACTIVITIES = ("CPU", "GPU")


class ProfileError(ValueError):
    """A profiling request the engine cannot follow; the message says why (answered with a 400)."""


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    output_dir: str | None = None
    start_step: int | None = None
    num_steps: int | None = None
    activities: tuple[str, ...] | None = None


class EngineProfiler:
    """One profile at a time, started, observed after each scheduler iteration and stopped on the
    scheduler's thread (torch.profiler records the CPU side of the thread that runs the passes)."""

    def __init__(self, device: torch.device, default_dir: str) -> None:
        self.device = device
        self.default_dir = default_dir
        self._request: ProfileRequest | None = None
        self._directory: Path | None = None
        self._name = ""
        self._capture: Capture | None = None
        self._end_at: int | None = None

    def start(self, request: ProfileRequest, passes: int) -> None:
        """Begins now, or at forward pass ``start_step`` if that is still ahead."""
        if self._request is not None:
            raise ProfileError("Profiling is already in progress. Call /stop_profile first.")
        activities = request.activities or ACTIVITIES
        unknown = sorted(set(activities) - set(ACTIVITIES))
        if unknown:
            raise ProfileError(
                f"activities {unknown} are not supported: the built-in engine records {list(ACTIVITIES)}"
            )
        directory = Path(request.output_dir or self.default_dir)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProfileError(f"output_dir {str(directory)!r} cannot be created: {exc}") from None
        self._request, self._directory = request, directory
        # SGLang's profile id: the time the profile was asked for.
        self._name = f"{time.time()}-TP-0"
        if request.start_step is None or request.start_step <= passes:
            self._begin(passes)

    def observe(self, passes: int) -> None:
        """After a scheduler iteration that ran ``passes`` forward passes since start. Never raises:
        it runs in the scheduler's loop, which a failed profile must not end."""
        request = self._request
        if request is None:
            return
        try:
            if self._capture is None and request.start_step is not None and passes >= request.start_step:
                self._begin(passes)
            if self._capture is not None and self._end_at is not None and passes >= self._end_at:
                self.stop()
        except Exception:
            log.exception("profiling failed; the profile is dropped")
            self._request, self._capture, self._end_at = None, None, None

    def stop(self) -> Path:
        """Ends the profile and writes its files; returns the summary's path."""
        if self._request is None or self._directory is None:
            raise ProfileError("Profiling is not in progress. Call /start_profile first.")
        capture, directory = self._capture, self._directory
        self._request, self._capture, self._end_at = None, None, None
        summary_path = directory / f"{self._name}.summary.json"
        if capture is None:
            summary = {"error": "stopped before its start_step"}
        else:
            summary = capture.stop(trace=directory / f"{self._name}.trace.json.gz")
        # Written whole, then renamed: a client polling for the file never reads half of it.
        partial = summary_path.with_suffix(".partial")
        partial.write_text(json.dumps(summary))
        partial.replace(summary_path)
        log.info("profile written to %s", summary_path)
        return summary_path

    def _begin(self, passes: int) -> None:
        assert self._request is not None
        try:
            self._capture = Capture(self.device, self._request.activities or ACTIVITIES)
        except RuntimeError as exc:  # the profiler itself (CUPTI held by another profiler, say)
            self._request = None
            raise ProfileError(f"torch.profiler did not start: {exc}") from None
        steps = self._request.num_steps
        self._end_at = passes + steps if steps else None
