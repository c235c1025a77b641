"""Keeping the engine on the newest policy: subscribe to paramsync, fetch, apply, report.

Fetching runs beside generation (the engine keeps serving the old version); only the switch
itself touches the engine, in the way ``partial_rollout_mode`` asks:

- ``abort_resume`` / ``restart``: one ``/update_weights_from_disk`` with ``abort_all_requests``
  (the engine aborts, loads and sets the version between two steps); interrupted samples are
  resubmitted or restarted by :mod:`services.rollout.generation`.
- ``in_place``: ``/pause_generation`` (in_place) → update → continue; running requests keep
  their KV cache and continue under the new weights.

Transports (``VersionAnnouncement.transport``): ``grpc`` receives the version straight into a
safetensors file in shared memory (``weights_shm_dir``, see ``services/paramsync/memfile.py``),
each tensor verified as it lands, and the engine maps that file and serves it in place (the
stack's engines: their ``shared_weights_dir``) or copies it into its parameters: no file is
written to disk and read back. So a file is reused only once the engine holds a newer version;
``disk`` loads the announced ``disk_path`` directly; ``distributed`` is pushed into the engine
by the sender (through the engine's ``/update_weights_from_distributed``), so the replica only
waits until the engine reports it.

A ``grpc`` or ``disk`` version the trainer also shares by handle on this host (``handles``: CUDA
IPC, or shared memory on a CPU) is loaded with nothing fetched: one ``/update_weights_from_tensor``
per bucket, several under one pause so no step runs on a mix of versions. When the engine cannot
open them (a restarted trainer, another kind of engine) the bytes load as usual; when it fails
part way, the bytes load before generation continues.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import shutil
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from relayrl.models.adapters import adapter_dir
from relayrl.retry import RetryPolicy, any_error, call_with_retries, retrying
from services.engine.client import (
    EngineClient,
    EngineError,
    EngineLinkError,
    EngineUnavailableError,
    UpdateResult,
    engine_link_failed,
)
from services.paramsync.manifest import WeightHandles
from services.paramsync.memfile import VersionFiles
from services.rollout.config import RolloutSettings
from services.rollout.generation import parse_version
from services.rollout.metrics import RolloutMetrics
from services.rollout.state import ReplicaState

log = logging.getLogger(__name__)

# Version files kept: the one the engine holds, and the one before, whose memory the next reuses.
_KEEP_VERSIONS = 2
# How long a switch keeps asking a paused engine to continue before leaving it to the engine probe.
RESUME_DEADLINE_S = 60.0
# The wait before subscribing again while no version loads: 1 s, doubling up to 30 s.
RESUBSCRIBE = RetryPolicy(attempts=None, first_wait_s=1.0, max_wait_s=30.0)


class Announcement(Protocol):
    version: int
    transport: str
    disk_path: str
    handles: WeightHandles | None


class WeightSource(Protocol):
    """What the replica needs from paramsync (ParamSyncClient fits)."""

    def subscribe(self, replica_id: str, held_version: int = 0, engine_url: str = "") -> Any: ...

    async def fetch_to_file(
        self, version: int, files: VersionFiles, replica_id: str = "", reusable_below: int = 0
    ) -> Path: ...

    async def report_version(
        self, replica_id: str, version: int, ok: bool = True, error: str = "", sync_s: float = 0.0
    ) -> int: ...


def _handles_here(ann: Announcement) -> WeightHandles | None:
    """The trainer's handles to a version, where this replica may use them: a ``grpc`` or ``disk``
    version shared on this host (only full weights are shared by handle)."""
    handles = ann.handles
    if handles is None or ann.transport not in ("grpc", "disk") or handles.host != socket.gethostname():
        return None
    return handles


def versions_dir(settings: RolloutSettings, weights_dir: Path) -> Path:
    """This replica's directory of version files: under ``weights_shm_dir`` where that exists
    (memory, and no disk write per version), else under ``weights_dir``."""
    shm = Path(settings.weights_shm_dir) if settings.weights_shm_dir else None
    if shm is None or not shm.is_dir():
        log.warning(
            "no shared-memory directory %r: versions are received into %s", settings.weights_shm_dir, weights_dir
        )
        shm = weights_dir
    # Replica ids repeat across runs and tests on one host (every stack has a rollout-0); the
    # replica's own weights_dir does not, and stays the same when the replica restarts.
    owner = hashlib.sha1(str(weights_dir.resolve()).encode()).hexdigest()[:10]
    return shm / f"relayrl-weights-{settings.replica_id}-{owner}"


class SyncFailed(RuntimeError):
    """A version announced by paramsync could not be loaded into the engine."""

    def __init__(self, version: int) -> None:
        super().__init__(f"version {version} did not load")
        self.version = version


async def resume_generation(engine: EngineClient, deadline_s: float = RESUME_DEADLINE_S) -> None:
    """``continue_generation``, retried until the engine answers: an engine left paused by a lost
    answer generates nothing and says nothing, so this must not give up at the first reset."""
    policy = RetryPolicy(attempts=None, deadline_s=deadline_s, first_wait_s=0.2, max_wait_s=2.0)
    try:
        await call_with_retries("continue_generation", engine.continue_generation, engine_link_failed, policy, log)
    except (EngineUnavailableError, EngineLinkError) as exc:
        # The engine watch resumes it again when it sees the engine come back (EngineWatch.run).
        log.error("engine did not answer continue_generation for %.0fs: %r", deadline_s, exc)


class HandlesRefused(EngineError):
    """The engine refused the first bucket of a version's handles: nothing in it changed."""


class SubscriptionEnded(RuntimeError):
    """Paramsync closed the announcement stream."""


@dataclass(frozen=True, slots=True)
class HeldAdapter:
    """A LoRA adapter version loaded into the engine: its version, its name there, its peft directory."""

    version: int
    name: str
    directory: Path


@dataclass
class WeightSync:
    """Loads each version paramsync announces into the engine, and records it in the replica's state.

    ``resubscribe`` is the backoff between subscriptions while no version loads (1 s doubling to
    30 s by default); it starts over after each version that loads. The version files are
    deleted when :meth:`run_forever` ends (or at :meth:`close`).
    """

    state: ReplicaState
    source: WeightSource
    engine: EngineClient
    settings: RolloutSettings
    weights_dir: Path
    metrics: RolloutMetrics
    resubscribe: RetryPolicy = RESUBSCRIBE
    files: VersionFiles = field(init=False)
    # Names of the LoRA adapters loaded into the engine, oldest first (adapter versions only).
    adapters: list[str] = field(init=False, default_factory=list)
    # The adapter version requests name, as loaded: what a restarted engine must get back.
    adapter: HeldAdapter | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.files = VersionFiles(versions_dir(self.settings, self.weights_dir), keep=_KEEP_VERSIONS)

    def close(self) -> None:
        self.files.close()

    @property
    def in_place(self) -> bool:
        """``partial_rollout_mode: in_place``: running requests keep their KV cache across a switch."""
        return self.settings.partial_rollout_mode == "in_place"

    async def run_forever(self) -> None:
        """Runs the subscription; subscribes again when it breaks, when a version did not load, or
        when the engine restarted (paramsync then sends the latest version at once, so a restarted
        engine gets the current weights back and a failed load is tried again)."""
        try:
            while True:
                async for attempt in retrying("weight sync subscription", any_error, self.resubscribe, log):
                    with attempt:
                        await self._subscribe_once()
        finally:
            self.close()

    async def _subscribe_once(self) -> None:
        """One subscription, until the engine restarts or the subscription ends. It returns (and
        the backoff starts over) when the engine restarted or a version loaded meanwhile; else it
        raises what ended the subscription."""
        held_before = self.state.held_version
        run = asyncio.create_task(self.run())
        restart = asyncio.create_task(self.state.engine_restarted())
        try:
            await asyncio.wait({run, restart}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (run, restart):
                task.cancel()
            await asyncio.gather(run, restart, return_exceptions=True)
        if self.state.take_engine_restart():
            return
        error = (None if run.cancelled() else run.exception()) or SubscriptionEnded("paramsync closed the stream")
        if self.state.held_version > held_before:
            log.warning("weight sync stopped after loading a version: %r; re-subscribing", error)
            return
        raise error

    async def run(self) -> None:
        """Loads each announced version; raises :class:`SyncFailed` at the first that does not load.

        :meth:`run_forever` subscribes again after a backoff, and paramsync then announces its
        newest version at once: a failed load is retried even when no newer version follows (a
        trainer waiting for this replica's groups publishes none).
        """
        replica_id, engine_url = self.state.replica_id, self.settings.engine_url
        async for ann in self.source.subscribe(replica_id, self.state.held_version, engine_url):
            self.state.note_latest(ann.version)
            # Versions only move forward: an announcement at or below what the engine holds is skipped.
            if ann.version <= self.state.held_version:
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
                route = await self._load(ann)
                self.metrics.versions_loaded.labels(route=route).inc()
        except Exception as exc:
            log.warning("could not load version %d: %r", ann.version, exc)
            self.metrics.param_sync_failures.inc()
            await self._report(ann.version, ok=False, error=str(exc)[:500])
            return False
        elapsed = time.perf_counter() - started
        self.state.hold(ann.version, elapsed)
        await self._report(ann.version, ok=True, sync_s=elapsed)
        if self.adapter is not None and self.adapter.version == ann.version:
            # Housekeeping after the report: the engine serves the adapter already, and an unload
            # waits for the engine's next step (about as long as the rest of an adapter switch).
            await self._unload_old_adapters()
        self.files.prune()
        return True

    async def _load(self, ann: Announcement) -> str:
        """Loads a ``grpc`` or ``disk`` version: by handle where the trainer shares it on this host,
        else (or when the engine cannot open the handles) from its bytes. Returns the route that
        loaded it: ``handles`` or ``bytes``."""
        handles = _handles_here(ann) if self.settings.load_weights_by_handle else None
        if handles is not None:
            try:
                return await self._switch_by_handle(ann, handles)
            except HandlesRefused as exc:
                log.warning("version %d did not load by handle (%s); loading its bytes", ann.version, exc)
                self.metrics.handle_fallbacks.inc()
        path = await self._fetch(ann)
        adapter = self._adapter_dir(path, ann.version)
        if adapter is None:
            await self._switch_weights(str(path), ann.version)
        else:
            await self._switch_adapter(adapter, ann.version)
        return "bytes"

    async def _fetch(self, ann: Announcement) -> Path:
        started = time.perf_counter()
        path = await self._materialise(ann)
        self.metrics.weight_fetch.observe(time.perf_counter() - started)
        return path

    async def _materialise(self, ann: Announcement) -> Path:
        if ann.transport == "disk":
            if not ann.disk_path:
                raise ValueError(f"disk announcement of version {ann.version} has no disk_path")
            return Path(ann.disk_path)
        if ann.transport != "grpc":
            raise ValueError(f"unknown weight transport {ann.transport!r}")
        # The engine has read every file older than the version it holds: their memory is free.
        return await self.source.fetch_to_file(
            ann.version, self.files, self.state.replica_id, reusable_below=self.state.held_version
        )

    def _adapter_dir(self, path: Path, version: int) -> Path | None:
        """The peft directory of an adapter version (a LoRA trainer's; see services/engine/lora.py), else None."""
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if len(files) != 1:
            return None
        return adapter_dir(files[0], self.files.root / "adapters" / f"v{version}", self.settings.lora_alpha)

    async def _switch_adapter(self, directory: Path, version: int) -> None:
        """An adapter version: loaded under a new name next to the previous ones. New requests name
        it from the switch on; the previous adapter stays loaded until the next switch, as requests
        built just before this one still name it, and the one before that is unloaded once the
        version is reported (:meth:`_unload_old_adapters`)."""
        name = f"relayrl-v{version}"

        async def load() -> UpdateResult:
            result = await self.engine.load_lora_adapter(name, str(directory))
            if result.success:
                result = await self.engine.update_weight_version(version)
            if result.success:
                # Before generation continues: every request from here on names the new adapter.
                self.engine.lora_adapter = name
            return result

        await self._switch(version, load)
        self.adapter = HeldAdapter(version, name, directory)
        self.adapters.append(name)

    async def _unload_old_adapters(self) -> None:
        """Unloads the adapters before the last two from the engine, and deletes their directories."""
        while len(self.adapters) > _KEEP_VERSIONS:
            name = self.adapters.pop(0)
            try:
                result = await self.engine.unload_lora_adapter(name)
            except EngineError as exc:
                # The version is loaded and reported either way; an adapter left loaded costs memory, not answers.
                result = UpdateResult(success=False, message=repr(exc))
            if not result.success:
                log.warning("could not unload LoRA adapter %s: %s", name, result.message)
        for old in (self.files.root / "adapters").glob("v*"):
            if f"relayrl-{old.name}" not in self.adapters:
                shutil.rmtree(old, ignore_errors=True)

    async def restore_adapter(self, engine_version: int) -> int | None:
        """Called when the engine comes back at ``engine_version``, below the held version (it
        restarted and serves its base weights). When the held version is an adapter, the adapter
        is loaded again from this replica's own copy (a LoRA run never changes the base weights,
        so base plus adapter is that version again) and the engine's version is set back to it.
        Returns the version the engine now serves, or None while a switch holds the engine (the
        engine watch asks again at its next probe).

        Requests name an adapter the engine holds either way: if the adapter does not load, they
        name none (the base model, the engine's version) until the re-subscription that the older
        version starts loads the version again."""
        held = self.adapter
        if held is None or held.version != self.state.held_version:
            return engine_version
        if self.state.control_busy():
            return None
        async with self.state.controlling():
            # The new engine holds no adapter: the ones loaded into the old one went with it.
            self.adapters.clear()
            try:
                result = await self.engine.load_lora_adapter(held.name, str(held.directory))
                if result.success:
                    result = await self.engine.update_weight_version(held.version)
            except EngineError as exc:
                result = UpdateResult(success=False, message=repr(exc))
            if not result.success:
                log.warning(
                    "adapter version %d did not load into the restarted engine: %s", held.version, result.message
                )
                self.engine.lora_adapter = None
                self.adapter = None
                return engine_version
            self.adapters.append(held.name)
        log.info("adapter version %d loaded again into the restarted engine", held.version)
        return held.version

    async def _switch_weights(self, path: str, version: int) -> None:
        """Full weights. ``in_place`` freezes the running requests around the update (:meth:`_switch`;
        SGLang cannot flush its cache while they sit in the running batch). The abort modes need no
        pause: one update call aborts every request, loads the weights and sets the version, all
        between two of the engine's steps (SGLang's ``abort_all_requests``; its new requests wait
        for the update). The engine holds generation while it installs the weights, not also for
        the round trips between a pause, the update and a continue, and no lost pause or continue
        answer can leave it paused. The aborted samples come back and are resubmitted at the new
        version."""

        async def update() -> UpdateResult:
            return await self.engine.update_weights_from_disk(
                path, weight_version=version, flush_cache=not self.in_place, abort_all_requests=not self.in_place
            )

        await self._switch(version, update, pause=self.in_place)

    async def _switch_by_handle(self, ann: Announcement, handles: WeightHandles) -> str:
        """Full weights by handle, one ``/update_weights_from_tensor`` per bucket. One bucket is one
        call, switched as :meth:`_switch_weights` switches; several are sent under one pause, as no
        step may run between two of them. Raises :class:`HandlesRefused` when the engine refuses the
        first bucket (nothing changed: the caller loads the bytes). When the engine may hold a mix
        of versions, the version's bytes are loaded before generation continues. Returns the route
        that loaded the version."""
        route = "handles"

        async def update() -> UpdateResult:
            nonlocal route
            mixed = await self._send_buckets(handles, ann.version)
            if mixed is None:
                return UpdateResult(success=True, message=f"version {ann.version} loaded by handle")
            route = "bytes"
            return await self._mend_with_bytes(ann, mixed)

        await self._switch(ann.version, update, pause=self.in_place or len(handles.buckets) > 1)
        return route

    async def _send_buckets(self, handles: WeightHandles, version: int) -> str | None:
        """Sends every bucket. Returns None once all loaded, else why the engine may hold a mix of
        versions (a later bucket failed, or the link broke amid several). Raises
        :class:`HandlesRefused` when the first is refused, and a lone bucket's link error (the
        whole version in one call, as a switch by bytes)."""
        for index in range(len(handles.buckets)):
            try:
                result = await self._update_by_handle(handles, index, version)
            except EngineError as exc:
                if len(handles.buckets) == 1:
                    raise
                return repr(exc)  # the engine may have loaded this bucket before the link broke
            if not result.success:
                if index == 0:
                    raise HandlesRefused(result.message)
                return result.message
        return None

    async def _update_by_handle(self, handles: WeightHandles, index: int, version: int) -> UpdateResult:
        """Bucket ``index`` of ``handles``; the last sets the version and flushes the cache as a byte switch does."""
        last = index == len(handles.buckets) - 1
        # Several buckets are sent under a pause, which has already stopped generation.
        abort = len(handles.buckets) == 1 and not self.in_place
        return await self.engine.update_weights_from_tensor(
            [handles.buckets[index]],
            handles.load_format or None,
            weight_version=version if last else None,
            flush_cache=last and not self.in_place,
            abort_all_requests=abort,
        )

    async def _mend_with_bytes(self, ann: Announcement, why: str) -> UpdateResult:
        """A version that failed part way by handle: its bytes, loaded under the same pause."""
        log.warning(
            "version %d failed part way by handle (%s); loading its bytes before generation continues", ann.version, why
        )
        self.metrics.handle_fallbacks.inc()
        path = await self._fetch(ann)
        return await self.engine.update_weights_from_disk(
            str(path), weight_version=ann.version, flush_cache=not self.in_place
        )

    async def _switch(self, version: int, apply: Callable[[], Awaitable[UpdateResult]], pause: bool = True) -> None:
        """Runs ``apply`` between a pause (as ``partial_rollout_mode`` asks) and a continue; with
        ``pause`` False, ``apply`` is one call the engine runs between two steps, and its whole time
        counts as the pause (an upper bound: the engine keeps generating while it maps the file
        and ends its running step)."""
        async with self.state.controlling():
            # A replica paused by its operator stays paused; the update still lands.
            user_paused = self.state.paused
            pausing = pause and not user_paused
            paused_at = time.perf_counter()
            try:
                if pausing:
                    await self.engine.pause_generation("in_place" if self.in_place else "abort")
                applying = time.perf_counter()
                result = await apply()
                self.metrics.weight_apply.observe(time.perf_counter() - applying)
            finally:
                # Also when the pause itself failed: its answer may be what was lost, not the pause.
                if pausing:
                    await resume_generation(self.engine)
                if not user_paused:
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
            latest = await self.source.report_version(self.state.replica_id, version, ok=ok, error=error, sync_s=sync_s)
            self.state.note_latest(latest)
        except Exception as exc:  # the table catches up on the next report; generation goes on
            log.warning("could not report version %d to paramsync: %r", version, exc)
