"""Checkpoints with ``torch.distributed.checkpoint``: sharded model and optimizer state from
every rank, plus the schedulers, each rank's RNG and the trainer's own state (step, version,
dataset position, counters).

Every rank writes into ``.partial-step_N``; once all have finished, rank 0 renames it to
``step_N`` and then points ``latest`` at it (both atomic, fsynced). A trainer killed mid-save
leaves a partial directory no one reads (the next save clears it) and resumes from the previous
checkpoint. The trainer acknowledges queue entries only after this point.

:class:`Checkpointer` takes the same checkpoint asynchronously (``async_save``, as Megatron's
``--async-save`` and torchtitan do): the step loop only stages a host copy of the shards
(``dcp.async_save``) and writes the small files; a background thread writes the shards, on a gloo
group of its own so its collectives never interleave with training's, and rank 0 then renames
and marks it latest there. The trainer learns that a checkpoint became durable from
:meth:`Checkpointer.poll` and only then acknowledges the groups it holds, so the queue position
and the weights stay consistent whatever moment a kill lands on.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from relayrl.models.adapters import CONFIG_FILE
from services.trainer import distributed as D
from services.trainer import lora
from services.trainer.step import Models

LATEST = "latest"


def _stateful(models: Models) -> dict[str, Any]:
    state = {
        "actor": get_model_state_dict(models.actor),
        "actor_optim": get_optimizer_state_dict(models.actor, models.actor_opt),
    }
    if models.critic is not None and models.critic_opt is not None:
        state["critic"] = get_model_state_dict(models.critic)
        state["critic_optim"] = get_optimizer_state_dict(models.critic, models.critic_opt)
    return state


def _fsync_dir(path: Path) -> None:
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(path)


def save(
    root: Path,
    step: int,
    models: Models,
    trainer_state: dict[str, Any],
    keep: int,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Writes checkpoint ``step`` (collective: every rank calls it) and marks it latest.

    ``extra``, when given, is called on every rank with the unfinished directory to add more to it
    (the Hugging Face copy of ``save_hf_model``); a crash inside it leaves no finished checkpoint.
    """
    path = root / f"step_{step:08d}"
    if latest(root) == path:
        return path  # this very state is already durable (a stop right after a checkpoint)
    partial = _begin(root, path)
    dcp.save(_stateful(models), checkpoint_id=str(partial))
    _write_small_files(partial, models, trainer_state)
    if extra is not None:
        extra(partial)
    D.barrier()
    if D.get_rank() == 0:
        _finish(root, path, partial, keep)
    D.barrier()
    return path


def _begin(root: Path, path: Path) -> Path:
    """Clears torn saves and returns the partial directory of ``path`` (collective)."""
    partial = root / f".partial-{path.name}"
    if D.get_rank() == 0:
        for stale in root.glob(".partial-step_*"):
            shutil.rmtree(stale, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    D.barrier()
    return partial


def _write_small_files(partial: Path, models: Models, trainer_state: dict[str, Any]) -> None:
    """This rank's RNG; on rank 0 the schedulers, the trainer state and what export needs."""
    partial.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"cpu": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        partial / f"rng_rank{D.get_rank()}.pt",
    )
    if D.get_rank() == 0:
        schedulers = {"actor": models.actor_sched.state_dict()}
        if models.critic_sched is not None:
            schedulers["critic"] = models.critic_sched.state_dict()
        torch.save(schedulers, partial / "schedulers.pt")
        (partial / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        if lora.is_peft(models.actor):
            # What `relayrl export` needs to turn the actor's shards back into a peft adapter.
            (partial / CONFIG_FILE).write_text(json.dumps(lora.adapter_config(models.actor), indent=1))


def _finish(root: Path, path: Path, partial: Path, keep: int) -> None:
    """Rank 0, once every rank's files are in ``partial``: makes it ``path`` and points ``latest`` at it."""
    _fsync_tree(partial)
    # A step_N that ``latest`` does not name is an older save of this step that never
    # completed the switch below; it is not the checkpoint anyone resumes from.
    shutil.rmtree(path, ignore_errors=True)
    os.replace(partial, path)
    _fsync_dir(root)
    _write_atomic(root / LATEST, path.name)
    _prune(root, keep)


@dataclass
class _InFlight:
    step: int
    done: Future[None]  # set once the checkpoint is durable (rank 0) or this rank's shards are written


class Checkpointer:
    """Checkpoints of one run, each taken synchronously or, with ``async_save``, in the background.

    One checkpoint is in flight at a time: starting the next one waits for the one before.
    """

    def __init__(self, root: Path, keep: int, async_save: bool) -> None:
        self.root = root
        self.keep = keep
        self.async_save = async_save
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint") if async_save else None
        # A group of its own for the background writer's collectives (collective: every rank builds it).
        self._group = dist.new_group(backend="gloo") if async_save and D.active() else None
        self._in_flight: _InFlight | None = None

    def save(
        self,
        step: int,
        models: Models,
        trainer_state: dict[str, Any],
        extra: Callable[[Path], None] | None = None,
    ) -> int | None:
        """Takes checkpoint ``step`` (collective). Returns the step of a checkpoint that became durable
        meanwhile (this one when synchronous, the one before when it had to be waited for), or None."""
        if self._pool is None:
            save(self.root, step, models, trainer_state, self.keep, extra)
            return step
        before = self.wait()
        path = self.root / f"step_{step:08d}"
        if latest(self.root) == path:
            return before
        partial = _begin(self.root, path)
        # Everything but the shards is small and written now, so it matches the staged shards exactly.
        _write_small_files(partial, models, trainer_state)
        if extra is not None:
            extra(partial)
        D.barrier()
        # Stages a host copy of every shard before returning: training may change the weights at once.
        staged = dcp.async_save(_stateful(models), checkpoint_id=str(partial), process_group=self._group)
        written = staged if isinstance(staged, Future) else staged.upload_completion
        main = D.get_rank() == 0
        self._in_flight = _InFlight(step, self._pool.submit(self._complete, written, path, partial, main))
        return before

    def _complete(self, written: Future[Any], path: Path, partial: Path, main: bool) -> None:
        # The writer's last collective gathers every rank's results, so once rank 0's save is done
        # every rank's shards (and the small files each wrote before joining it) are on disk.
        written.result()
        if main:
            _finish(self.root, path, partial, self.keep)

    def poll(self) -> int | None:
        """The step of the checkpoint in flight if it has become durable since; re-raises its failure.

        Each rank answers for itself (rank 0 knows when the checkpoint is durable): only rank 0 acts on it.
        """
        if self._in_flight is None or not self._in_flight.done.done():
            return None
        return self._take()

    def wait(self) -> int | None:
        """Blocks until the checkpoint in flight is durable on every rank (collective); its step, or
        None when none was in flight."""
        step = self._take()
        D.barrier()  # rank 0 finishes the checkpoint: no rank may look at `latest` before it has
        return step

    def _take(self) -> int | None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return None
        in_flight.done.result()
        return in_flight.step

    def close(self) -> None:
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step_*") if p.is_dir())
    latest = (root / LATEST).read_text().strip()
    for old in done[:-keep]:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def latest(root: Path) -> Path | None:
    marker = root / LATEST
    if not marker.is_file():
        return None
    path = root / marker.read_text().strip()
    return path if (path / "trainer_state.json").is_file() else None


def load(root: Path, models: Models, path: Path | None = None) -> dict[str, Any] | None:
    """Restores the latest checkpoint (or the one at ``path``: `relayrl replay`) into ``models`` and returns
    the trainer state, or None."""
    path = latest(root) if path is None else path
    if path is None:
        return None
    state = _stateful(models)
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(models.actor, state["actor"])
    set_optimizer_state_dict(models.actor, models.actor_opt, state["actor_optim"])
    if models.critic is not None and models.critic_opt is not None:
        set_model_state_dict(models.critic, state["critic"])
        set_optimizer_state_dict(models.critic, models.critic_opt, state["critic_optim"])
    schedulers = torch.load(path / "schedulers.pt", weights_only=False)
    models.actor_sched.load_state_dict(schedulers["actor"])
    if models.critic_sched is not None and "critic" in schedulers:
        models.critic_sched.load_state_dict(schedulers["critic"])
    rng_file = path / f"rng_rank{D.get_rank()}.pt"
    if rng_file.is_file():
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["cpu"])
        if rng["cuda"]:
            torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "trainer_state.json").read_text())
