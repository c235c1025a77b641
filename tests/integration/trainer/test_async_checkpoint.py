"""Asynchronous checkpoints (``async_save``): the step loop goes on while a background thread writes,
yet what is written is the state at the moment the checkpoint was taken, and a trainer SIGKILLed
while the background write is under way resumes exactly from the checkpoint before it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from services.trainer import checkpoint as ckpt
from tests.integration.trainer.test_checkpoint import models, train

REPO = Path(__file__).resolve().parents[3]

# Takes checkpoint 1 asynchronously and waits for it, trains, takes checkpoint 2 asynchronously and
# trains on while it is written; the background writer is SIGKILLed (the whole process) as it is
# about to mark step 2 finished, after every shard of it landed: the latest moment a kill can land.
DIES_IN_BACKGROUND_WRITE = """
import os, signal, sys, threading, torch
from pathlib import Path
from services.trainer import checkpoint as ckpt
from tests.integration.trainer.test_checkpoint import models, train

root = Path(sys.argv[1])
m = models(seed=0)
train(m)
writer = ckpt.Checkpointer(root, keep=2, async_save=True)
assert writer.save(1, m, {"step": 1, "version": 1, "released": 8}) is None
torch.save({"actor": m.actor.state_dict(), "opt": m.actor_opt.state_dict(), "rng": torch.get_rng_state(),
            "lr": m.actor_sched.get_last_lr()}, root.parent / "at_step_1.pt")
assert writer.wait() == 1
train(m)
def dying(*args, **kwargs):
    assert threading.current_thread() is not threading.main_thread(), "the write was not in the background"
    os.kill(os.getpid(), signal.SIGKILL)
ckpt._finish = dying
writer.save(2, m, {"step": 2, "version": 2, "released": 16})
train(m)  # the loop goes on while the checkpoint is written
writer.wait()
"""


def test_a_trainer_killed_while_an_async_checkpoint_is_written_resumes_exactly_from_the_one_before(tmp_path):
    root = tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", DIES_IN_BACKGROUND_WRITE, str(root)], env=env, cwd=REPO, timeout=120)
    assert done.returncode == -signal.SIGKILL, "the writer was meant to die in the background write"
    assert (root / ".partial-step_00000002" / ".metadata").is_file(), "the kill landed before the shards were written"
    assert (root / ckpt.LATEST).read_text() == "step_00000001"

    resumed = models(seed=1)  # different initial weights: everything must come from the checkpoint
    state = ckpt.load(root, resumed)
    expected = torch.load(tmp_path / "at_step_1.pt", weights_only=False)
    assert state == {"step": 1, "version": 1, "released": 8}
    for name, tensor in expected["actor"].items():
        assert torch.equal(resumed.actor.state_dict()[name], tensor), name
    exp_state, got_state = expected["opt"]["state"], resumed.actor_opt.state_dict()["state"]
    for key in exp_state:
        for field in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(torch.as_tensor(got_state[key][field]), torch.as_tensor(exp_state[key][field]))
    assert resumed.actor_sched.get_last_lr() == expected["lr"]
    assert torch.equal(torch.get_rng_state(), expected["rng"])

    # The next save, asynchronous too, clears the torn one and becomes latest once durable.
    writer = ckpt.Checkpointer(root, keep=2, async_save=True)
    train(resumed)
    writer.save(2, resumed, {"step": 2, "version": 2, "released": 16})
    assert writer.wait() == 2
    writer.close()
    assert (root / ckpt.LATEST).read_text() == "step_00000002"
    assert not list(root.glob(".partial-*"))
    assert ckpt.load(root, models(seed=2)) == {"step": 2, "version": 2, "released": 16}


def test_an_async_checkpoint_holds_the_state_it_was_taken_at_while_training_goes_on(tmp_path):
    m = models(seed=0)
    train(m)
    at_save = {k: v.clone() for k, v in m.actor.state_dict().items()}
    exp_avg = {k: s["exp_avg"].clone() for k, s in m.actor_opt.state_dict()["state"].items()}
    writer = ckpt.Checkpointer(tmp_path, keep=2, async_save=True)
    writer.save(1, m, {"step": 1})
    for _ in range(3):
        train(m)  # changes the weights and the optimizer's moments in place while the write may run
    assert writer.wait() == 1
    writer.close()

    resumed = models(seed=1)
    assert ckpt.load(tmp_path, resumed) == {"step": 1}
    for name, tensor in at_save.items():
        assert torch.equal(resumed.actor.state_dict()[name], tensor), name
        assert not torch.equal(m.actor.state_dict()[name], tensor), "training did not move on"
    for key, moment in exp_avg.items():
        assert torch.equal(resumed.actor_opt.state_dict()["state"][key]["exp_avg"], moment)
