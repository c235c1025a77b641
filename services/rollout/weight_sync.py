"""Keeping the engine on the newest policy: subscribe to paramsync, fetch, apply, report.

Fetching runs beside generation (the engine keeps serving the old version); only the switch
itself touches the engine, in the way ``partial_rollout_mode`` asks:

- ``abort_resume`` / ``restart``: ``/pause_generation`` (abort) → ``/update_weights_from_disk``
  → ``/continue_generation``; interrupted samples are resubmitted or restarted by
  :mod:`services.rollout.generation`.
- ``in_place``: ``/pause_generation`` (in_place) → update → continue; running requests keep
  their KV cache and continue under the new weights.

Transports (``VersionAnnouncement.transport``): ``grpc`` fetches the chunks, verifies them and
writes one safetensors file the engine loads; ``disk`` loads the announced ``disk_path``
directly; ``distributed`` is pushed into the engine by the sender (through the engine's
``/update_weights_from_distributed``), so the replica only waits until the engine reports it.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from services.rollout.engine_client import EngineClient, EngineError, EngineUnavailableError
from services.rollout.generation import parse_version
from services.rollout.metrics import RolloutMetrics

log = logging.getLogger(__name__)

# Versions kept on local disk (the engine may still be reading the previous one).
_KEEP_VERSIONS = 2
# How long a switch keeps asking a paused engine to continue before leaving it to the engine probe.
RESUME_DEADLINE_S = 60.0


class Announcement(Protocol):
    version: int
    transport: str
    disk_path: str


class WeightSource(Protocol):
    """What the replica needs from paramsync (ParamSyncClient fits)."""

    def subscribe(self, replica_id: str, held_version: int = 0, engine_url: str = "") -> Any: ...

    async def fetch(self, version: int = 0, replica_id: str = "") -> dict[str, Any]: ...

    async def report_version(
        self, replica_id: str, version: int, ok: bool = True, error: str = "", sync_s: float = 0.0
    ) -> int: ...


def write_safetensors(tensors: dict[str, Any], directory: Path) -> Path:
    """Writes ``directory/model.safetensors`` through a temporary name, so the engine never reads half a file."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    partial = directory / "model.safetensors.partial"
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(partial))
    partial.rename(directory / "model.safetensors")
    return directory


class SyncFailed(RuntimeError):
    """A version announced by paramsync could not be loaded into the engine."""

    def __init__(self, version: int) -> None:
        super().__init__(f"version {version} did not load")
        self.version = version


async def resume_generation(engine: EngineClient, deadline_s: float = RESUME_DEADLINE_S) -> None:
    """``continue_generation``, retried until the engine answers: an engine left paused by a lost
    answer generates nothing and says nothing, so this must not give up at the first reset."""
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_delay(deadline_s),
            wait=wait_exponential(multiplier=0.2, max=2.0),
            retry=retry_if_exception_type((EngineUnavailableError, httpx.TransportError)),
            reraise=True,
        ):
            with attempt:
                await engine.continue_generation()
    except (EngineUnavailableError, httpx.TransportError) as exc:
        # The replica resumes it again when it sees the engine come back (Replica.watch_engine).
        log.error("engine did not answer continue_generation for %.0fs: %r", deadline_s, exc)


class WeightSync:
    def __init__(
        self,
        source: WeightSource,
        engine: EngineClient,
        replica_id: str,
        engine_url: str,
        mode: str,
        weights_dir: Path,
        control_lock: asyncio.Lock,
        is_paused: Callable[[], bool],
        held_version: Callable[[], int],
        on_version: Callable[[int, float], Awaitable[None]],
        on_latest: Callable[[int], None],
        metrics: RolloutMetrics,
    ) -> None:
        self.source = source
        self.engine = engine
        self.replica_id = replica_id
        self.engine_url = engine_url
        self.mode = mode
        self.weights_dir = weights_dir
        self.control_lock = control_lock
        self.is_paused = is_paused
        self.held_version = held_version
        self.on_version = on_version
        self.on_latest = on_latest
        self.metrics = metrics

    async def run(self) -> None:
        """Loads each announced version; raises :class:`SyncFailed` at the first that does not load.

        The caller (:func:`services.rollout.server.sync_forever`) subscribes again after a backoff,
        and paramsync then announces its newest version at once: a failed load is retried even when
        no newer version follows (a trainer waiting for this replica's groups publishes none).
        """
        async for ann in self.source.subscribe(self.replica_id, self.held_version(), self.engine_url):
            self.on_latest(ann.version)
            # Versions only move forward: an announcement at or below what the engine holds is skipped.
            if ann.version <= self.held_version():
                continue
            if not await self.sync(ann):
                raise SyncFailed(ann.version)

    async def sync(self, ann: Announcement) -> bool:
        started = time.perf_counter()
        self.metrics.param_sync_requests.inc()
        try:
            if ann.transport == "distributed":
                await self._await_engine_version(ann.version)
            else:
                path = await self._materialise(ann)
                await self._switch(str(path), ann.version)
        except Exception as exc:
            log.warning("could not load version %d: %r", ann.version, exc)
            self.metrics.param_sync_failures.inc()
            await self._report(ann.version, ok=False, error=str(exc)[:500])
            return False
        elapsed = time.perf_counter() - started
        await self.on_version(ann.version, elapsed)
        await self._report(ann.version, ok=True, sync_s=elapsed)
        self._prune()
        return True

    async def _materialise(self, ann: Announcement) -> Path:
        if ann.transport == "disk":
            if not ann.disk_path:
                raise ValueError(f"disk announcement of version {ann.version} has no disk_path")
            return Path(ann.disk_path)
        if ann.transport != "grpc":
            raise ValueError(f"unknown weight transport {ann.transport!r}")
        tensors = await self.source.fetch(ann.version, self.replica_id)
        target = self.weights_dir / f"v{ann.version:012d}"
        return await asyncio.to_thread(write_safetensors, tensors, target)

    async def _switch(self, path: str, version: int) -> None:
        async with self.control_lock:
            # A replica paused by its operator stays paused; the update still lands.
            user_paused = self.is_paused()
            paused_at = time.perf_counter()
            try:
                if not user_paused:
                    await self.engine.pause_generation("in_place" if self.mode == "in_place" else "abort")
                # SGLang cannot flush its cache while requests sit frozen in the running batch.
                result = await self.engine.update_weights_from_disk(
                    path, weight_version=version, flush_cache=self.mode != "in_place"
                )
            finally:
                # Also when the pause itself failed: its answer may be what was lost, not the pause.
                if not user_paused:
                    await resume_generation(self.engine)
                    self.metrics.generation_paused.observe(time.perf_counter() - paused_at)
            if not result.success:
                raise EngineError(f"engine refused version {version}: {result.message}")

    async def _await_engine_version(self, version: int, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while parse_version(await self.engine.weight_version(), -1) < version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"engine did not reach version {version} within {timeout_s}s")
            await asyncio.sleep(0.2)

    async def _report(self, version: int, ok: bool, error: str = "", sync_s: float = 0.0) -> None:
        try:
            latest = await self.source.report_version(self.replica_id, version, ok=ok, error=error, sync_s=sync_s)
            self.on_latest(latest)
        except Exception as exc:  # the table catches up on the next report; generation goes on
            log.warning("could not report version %d to paramsync: %r", version, exc)

    def _prune(self) -> None:
        if not self.weights_dir.is_dir():
            return
        versions = sorted(p for p in self.weights_dir.iterdir() if p.is_dir() and p.name.startswith("v"))
        for old in versions[:-_KEEP_VERSIONS]:
            shutil.rmtree(old, ignore_errors=True)
